// Package launch builds and runs the mpirun command line that starts N copies of a goaccel program, the
// way `accelerate launch` starts a PyTorch script. It is what the `accel launch` command and goaccel's own
// multi-process tests use.
//
// The command line is plain mpirun; what the package adds is the set of flags a Go program needs and that
// are easy to forget:
//
//   - --allow-run-as-root when running as root (containers), which Open MPI otherwise refuses;
//   - --oversubscribe when more processes than CPU cores are asked for on this machine (never on hosts:
//     there their slots decide);
//   - --bind-to none, because Open MPI binds each process to a single core when it starts two or fewer,
//     and Go sizes its scheduler (GOMAXPROCS) from the CPUs it may run on: every rank would compute on one
//     core however many the machine has;
//   - the Open MPI MCA parameters of [DefaultMCA], currently btl_vader_single_copy_mechanism=none where
//     the kernel refuses cross-process memory access (Docker's default seccomp profile);
//   - -x NAME for every variable of goaccel, GoMLX and PJRT, and CUDA_VISIBLE_DEVICES, that is set (see
//     [WithForwardEnv]): processes on other hosts get no other environment;
//   - --mca btl self,tcp when several hosts of the job are this machine under two or more Open MPI daemons
//     (127.0.0.1 and 127.0.0.2, to try a job "on two hosts" on one machine), whose processes cannot share
//     memory, and the loopback network when every host is this machine (see [WithNotice]).
//
// Each is added only when the user did not already decide: a flag of the same name among the extra
// mpirun arguments, or an OMPI_MCA_* variable in the environment, wins. Print the result with [Argv] (or
// `accel launch --dry-run`) to see exactly what runs.
//
// On several hosts ([WithHosts], a hostfile, or a Slurm allocation's hosts, see [SlurmHosts]), a job may
// also keep MPI's traffic on one network ([WithNetwork]) and start the remote daemons with another agent
// than ssh ([WithLaunchAgent]). Run first probes every other host through that agent ([WithHostProbe]) and
// names a host that cannot be reached ([HostError]); [Check] runs a short job that reports each process's
// host and build and the all-reduce bandwidth, as `accel launch --check` does, and quotes what its
// processes said when one fails (a crash report's lines that matter, see [WithCheckLogs]).
// [WithRankAnnouncements] has every process say its rank, host and PID as it starts, for [Output].
package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrMPIRunNotFound is returned (wrapped) when the mpirun program cannot be found.
var ErrMPIRunNotFound = errors.New("mpirun not found: install Open MPI " +
	"(`apt-get install openmpi-bin libopenmpi-dev`) or MPICH, or name the launcher with WithMPIRun")

// Flavor is the MPI implementation behind mpirun; the flags goaccel adds depend on it.
type Flavor int

const (
	// UnknownFlavor adds no implementation-specific flags.
	UnknownFlavor Flavor = iota
	// OpenMPI is Open MPI's mpirun (ORTE in 4.x, PRRTE in 5.x).
	OpenMPI
	// MPICH is MPICH's Hydra mpiexec/mpirun, also used by Intel MPI. It needs none of the Open MPI flags:
	// it runs as root, oversubscribes and leaves processes unbound by default.
	MPICH
)

func (f Flavor) String() string {
	switch f {
	case OpenMPI:
		return "Open MPI"
	case MPICH:
		return "MPICH"
	}
	return "unknown MPI"
}

// MCAParam is an Open MPI MCA parameter goaccel sets, with the reason.
type MCAParam struct {
	Name, Value string
	Why         string
}

// Option configures the command line.
type Option func(*config)

type config struct {
	mpirun     string
	hostfile   string
	extra      []string
	flavor     Flavor
	flavorSet  bool
	asRoot     bool
	asRootSet  bool
	cpus       int
	bindTo     string
	mca        []MCAParam
	defaultMCA bool
	environ    []string
	stdin      io.Reader
	stdout     io.Writer
	stderr     io.Writer
	tagOutput  bool
	// maxRestarts, restartNotice and failureNotice: see WithMaxRestarts.
	maxRestarts   int
	restartNotice func(Restart)
	failureNotice func(Failure)
	// hosts, network, agent, forward and probeTimeout: see WithHosts, WithNetwork, WithLaunchAgent,
	// WithForwardEnv and WithHostProbe.
	hosts        []Host
	network      string
	agent        string
	forward      []string
	probeTimeout time.Duration
	// memo: what the job's host names are to this machine, and its notices (see WithNotice).
	memo *machineMemo
	// announce: see WithRankAnnouncements; checkLogs: see WithCheckLogs.
	announce  bool
	checkLogs string
	// hangOut and jobTimeout: see WithHangReports and WithJobTimeout.
	hangOut    *Output
	jobTimeout time.Duration
	// timeline: see WithTimeline.
	timeline string
}

// WithMPIRun names the launcher program (default "mpirun", looked up on PATH), for example "mpiexec" or
// an absolute path.
func WithMPIRun(program string) Option { return func(c *config) { c.mpirun = program } }

// WithHostfile runs the processes on the hosts listed in path (mpirun --hostfile). With a hostfile goaccel
// no longer adds --oversubscribe: the hostfile's slots say how many processes each host takes. Run, Command
// and Check read the file before anything runs and refuse it unless every line is a host as --hosts takes
// its names, optionally with slots (NAME, NAME:SLOTS, NAME slots=N KEY=VALUE...; '#' comments); Argv only
// prints the file's name.
func WithHostfile(path string) Option { return func(c *config) { c.hostfile = path } }

// WithMPIRunArgs passes extra arguments to mpirun, before the program. A flag given here takes precedence
// over goaccel's default for the same flag.
func WithMPIRunArgs(args ...string) Option {
	return func(c *config) { c.extra = append(c.extra, args...) }
}

// WithFlavor says which MPI implementation mpirun belongs to instead of asking `mpirun --version`.
func WithFlavor(f Flavor) Option { return func(c *config) { c.flavor, c.flavorSet = f, true } }

// WithRunAsRoot says whether the job runs as root instead of checking the effective user id.
func WithRunAsRoot(root bool) Option { return func(c *config) { c.asRoot, c.asRootSet = root, true } }

// WithCPUs sets the number of cores that decides --oversubscribe (default runtime.NumCPU()).
func WithCPUs(n int) Option { return func(c *config) { c.cpus = n } }

// WithBindTo sets Open MPI's --bind-to policy ("none" by default, see the package documentation; "core",
// "socket", ...). The empty string leaves mpirun's own default.
func WithBindTo(policy string) Option { return func(c *config) { c.bindTo = policy } }

// WithMCA sets an Open MPI MCA parameter (--mca name value); it replaces a default of the same name.
func WithMCA(name, value string) Option {
	return func(c *config) {
		c.mca = append(c.mca, MCAParam{Name: name, Value: value, Why: "requested"})
	}
}

// WithoutDefaultMCA leaves out the MCA parameters of DefaultMCA.
func WithoutDefaultMCA() Option { return func(c *config) { c.defaultMCA = false } }

// WithEnviron sets the environment the job starts with and that goaccel's defaults consult (an
// OMPI_MCA_* variable suppresses the default of the same parameter). Default: os.Environ().
func WithEnviron(env []string) Option { return func(c *config) { c.environ = env } }

// WithStdio connects the job's standard streams (for Run; default: this process's).
func WithStdio(stdin io.Reader, stdout, stderr io.Writer) Option {
	return func(c *config) { c.stdin, c.stdout, c.stderr = stdin, stdout, stderr }
}

func newConfig(opts []Option) *config {
	c := &config{mpirun: "mpirun", bindTo: "none", defaultMCA: true, probeTimeout: DefaultProbeTimeout,
		memo: &machineMemo{}}
	for _, opt := range opts {
		opt(c)
	}
	if !c.asRootSet {
		c.asRoot = os.Geteuid() == 0
	}
	if c.cpus <= 0 {
		c.cpus = runtime.NumCPU()
	}
	if c.environ == nil {
		c.environ = os.Environ()
	}
	c.addTimeline()
	c.assignForwarded()
	return c
}

// Argv returns the command line that runs procs copies of program with args: argv[0] is the launcher as
// named (see WithMPIRun). procs 0 is the default count: one process per slot with hosts (WithHosts, or a
// Slurm allocation's), mpirun's own (one per slot) with a hostfile, and 1 on this machine alone. Unless
// WithFlavor says which MPI it is, it runs `mpirun --version` to find out, and fails with
// ErrMPIRunNotFound when there is no mpirun.
func Argv(procs int, program string, args []string, opts ...Option) ([]string, error) {
	return newConfig(opts).argv(procs, program, args)
}

func (c *config) argv(procs int, program string, args []string) ([]string, error) {
	if program == "" {
		return nil, errors.New("launch: missing program to run")
	}
	if !c.flavorSet {
		f, err := DetectFlavor(c.mpirun)
		if err != nil {
			return nil, err
		}
		c.flavor = f
	}
	hosts, err := c.jobHosts()
	if err != nil {
		return nil, err
	}
	switch slots := totalSlots(hosts); {
	case procs < 0:
		return nil, fmt.Errorf("launch: need at least 1 process, got %d", procs)
	case procs == 0 && len(hosts) > 0:
		procs = slots
	case procs == 0 && c.hostfile == "" && !slices.ContainsFunc(hostFlags, c.hasFlag):
		procs = 1
	case len(hosts) > 0 && procs > slots:
		return nil, fmt.Errorf("launch: %d processes do not fit the %d slots of hosts %s: give fewer processes or "+
			"more slots (HOST:SLOTS)", procs, slots, hostList(hosts))
	}
	forward, err := c.forwarded()
	if err != nil {
		return nil, err
	}
	argv := []string{c.mpirun}
	if procs > 0 {
		argv = append(argv, "-np", fmt.Sprint(procs))
	}
	switch {
	case len(hosts) > 0 && c.flavor == MPICH:
		argv = append(argv, "-hosts", hostList(hosts))
	case len(hosts) > 0:
		argv = append(argv, "--host", hostList(hosts))
	case c.hostfile != "" && c.flavor == MPICH:
		argv = append(argv, "-hostfile", c.hostfile)
	case c.hostfile != "":
		argv = append(argv, "--hostfile", c.hostfile)
	}
	switch c.flavor {
	case OpenMPI:
		if c.asRoot && !c.hasFlag("allow-run-as-root") {
			argv = append(argv, "--allow-run-as-root")
		}
		// On hosts the slots decide; --oversubscribe would hide a host list that is too short.
		if !c.placesOnHosts() && procs > c.cpus && !c.hasFlag("oversubscribe") {
			argv = append(argv, "--oversubscribe")
		}
		if c.bindTo != "" && !c.hasFlag("bind-to") && c.env("OMPI_MCA_hwloc_base_binding_policy") == "" {
			argv = append(argv, "--bind-to", c.bindTo)
		}
		for _, p := range c.mcaParams() {
			argv = append(argv, "--mca", p.Name, p.Value)
		}
		// Several hosts that are this machine: transports that work between daemons of one machine.
		for _, p := range c.sameMachineMCA(hosts) {
			argv = append(argv, "--mca", p.Name, p.Value)
		}
		if c.agent != "" {
			argv = append(argv, "--mca", "plm_rsh_agent", c.agent)
		}
		if c.network != "" {
			parts, _, err := networkParts(c.network)
			if err != nil {
				return nil, err
			}
			list := strings.Join(parts, ",")
			argv = append(argv, "--mca", "btl_tcp_if_include", list, "--mca", "oob_tcp_if_include", list)
		}
		if c.tagOutput && !c.hasFlag("tag-output") {
			argv = append(argv, "--tag-output")
		}
		// Local processes inherit mpirun's environment; those on other hosts get what -x names.
		for _, name := range forward {
			argv = append(argv, "-x", name)
		}
	case MPICH:
		// Hydra passes the launcher's whole environment to every process by default: nothing to forward.
		if c.agent != "" {
			argv = append(argv, "-launcher-exec", c.agent)
		}
		if c.network != "" {
			parts, interfaces, err := networkParts(c.network)
			if err != nil {
				return nil, err
			}
			if !interfaces || len(parts) != 1 {
				return nil, fmt.Errorf("launch: network %q: MPICH's mpiexec takes one interface name (-iface eth0), "+
					"not a subnet or a list", c.network)
			}
			argv = append(argv, "-iface", parts[0])
		}
	default:
		if len(hosts) > 0 || c.network != "" || c.agent != "" {
			return nil, fmt.Errorf("launch: hosts, a network or a launch agent need Open MPI or MPICH, and %s is %s: "+
				"pass mpirun's own words with WithMPIRunArgs (--mpirun-arg)", c.mpirun, c.flavor)
		}
	}
	argv = append(argv, c.extra...)
	// dash's exec reads a leading '-' as an option, and takes no "--": such a program is not announced.
	if c.announce && c.flavor == OpenMPI && !strings.HasPrefix(program, "-") {
		argv = append(argv, announcer...)
	}
	argv = append(argv, program)
	argv = append(argv, args...)
	c.notify(hosts)
	return argv, nil
}

// hostFlags are the mpirun flags that place processes on hosts (Open MPI's and MPICH's spellings).
var hostFlags = []string{"host", "H", "hosts", "hostfile", "machinefile", "default-hostfile", "f"}

// placesOnHosts reports whether the job runs on hosts named by goaccel's options or by the extra mpirun
// arguments, rather than on this machine alone.
func (c *config) placesOnHosts() bool {
	return len(c.hosts) > 0 || c.hostfile != "" || slices.ContainsFunc(hostFlags, c.hasFlag) || c.inSlurm()
}

// jobHosts is where the job runs: WithHosts's hosts, or else, inside a Slurm allocation and with no
// hostfile or host flag among the extra arguments, the allocation's. Host options that contradict each
// other are an error.
func (c *config) jobHosts() ([]Host, error) {
	if len(c.hosts) > 0 {
		if err := checkHosts(c.hosts); err != nil {
			return nil, err
		}
		if c.hostfile != "" {
			return nil, fmt.Errorf("launch: both hosts (%s) and a hostfile (%s): give one", hostList(c.hosts), c.hostfile)
		}
		if i := slices.IndexFunc(hostFlags, c.hasFlag); i >= 0 {
			return nil, fmt.Errorf("launch: both hosts (%s) and -%s among the mpirun arguments: give one",
				hostList(c.hosts), hostFlags[i])
		}
		return c.hosts, nil
	}
	if c.hostfile != "" || slices.ContainsFunc(hostFlags, c.hasFlag) || !c.inSlurm() {
		return nil, nil
	}
	return SlurmHosts(c.environ)
}

// mcaParams returns the defaults the user did not decide on (by WithMCA, in the extra arguments, or with
// an OMPI_MCA_* variable in the environment), followed by the parameters requested with WithMCA.
func (c *config) mcaParams() []MCAParam {
	var out []MCAParam
	if c.defaultMCA {
		for _, p := range DefaultMCA() {
			requested := slices.ContainsFunc(c.mca, func(q MCAParam) bool { return q.Name == p.Name })
			if !requested && c.env("OMPI_MCA_"+p.Name) == "" && !c.extraSetsMCA(p.Name) {
				out = append(out, p)
			}
		}
	}
	return append(out, c.mca...)
}

// hasFlag reports whether the extra arguments contain the Open MPI flag name, spelled with one or two
// dashes, alone or with =value.
func (c *config) hasFlag(name string) bool {
	for _, a := range c.extra {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

func (c *config) extraSetsMCA(name string) bool {
	for i, a := range c.extra {
		if (a == "--mca" || a == "-mca" || a == "--gmca" || a == "-gmca") && i+1 < len(c.extra) && c.extra[i+1] == name {
			return true
		}
	}
	return false
}

func (c *config) env(name string) string {
	v, _ := c.lookupEnv(name)
	return v
}

// lookupEnv is os.LookupEnv in the job's environment (the last value of a name wins, as in exec.Cmd).
func (c *config) lookupEnv(name string) (string, bool) {
	for _, kv := range slices.Backward(c.environ) {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v, true
		}
	}
	return "", false
}

// DefaultMCA returns the Open MPI MCA parameters goaccel adds on this machine, with the reason for each:
//
//   - btl_vader_single_copy_mechanism=none when the kernel does not let processes read each other's memory
//     (process_vm_readv fails, as under Docker's default seccomp profile without CAP_SYS_PTRACE, or Yama's
//     ptrace_scope forbids it). Open MPI's shared-memory transport then logs "Read -1, expected N,
//     errno = 1" for every large message and falls back to a slower path on its own; "none" goes straight
//     to copy-in/copy-out through the shared segment. Where single copy works it is faster
//     (docs/notes.md, Note [Open MPI's single-copy transport]), so it is left on.
//
// The check looks at the machine running the launcher; on a cluster whose nodes differ, set the parameter
// yourself (`--mca btl_vader_single_copy_mechanism none` or OMPI_MCA_btl_vader_single_copy_mechanism=none).
func DefaultMCA() []MCAParam {
	var params []MCAParam
	if ok, why := probeSingleCopy(); !ok {
		params = append(params, MCAParam{Name: "btl_vader_single_copy_mechanism", Value: "none",
			Why: "cross-process memory access (CMA) is unavailable: " + why})
	}
	return params
}

// probeSingleCopy is singleCopyWorks, replaceable in tests.
var probeSingleCopy = singleCopyWorks

var (
	flavorMu    sync.Mutex
	flavorCache = map[string]Flavor{}
)

// DetectFlavor asks the launcher (for example "mpirun") which MPI implementation it belongs to, running
// `mpirun --version` once per launcher name per process. It fails with ErrMPIRunNotFound when the launcher
// is not on PATH.
func DetectFlavor(mpirun string) (Flavor, error) {
	flavorMu.Lock()
	defer flavorMu.Unlock()
	if f, ok := flavorCache[mpirun]; ok {
		return f, nil
	}
	path, err := exec.LookPath(mpirun)
	if err != nil {
		return UnknownFlavor, fmt.Errorf("launch: %q: %w", mpirun, ErrMPIRunNotFound)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, path, "--version").CombinedOutput()
	f := flavorOf(string(out))
	flavorCache[mpirun] = f
	return f, nil
}

func flavorOf(versionText string) Flavor {
	switch v := strings.ToLower(versionText); {
	case strings.Contains(v, "open mpi") || strings.Contains(v, "openrte") || strings.Contains(v, "open-mpi"):
		return OpenMPI
	case strings.Contains(v, "hydra") || strings.Contains(v, "mpich") || strings.Contains(v, "intel"):
		return MPICH
	}
	return UnknownFlavor
}

// Command returns the mpirun command for procs copies of program, ready to start. Its standard streams are
// unset (exec's default: /dev/null) unless WithStdio is given. Cancelling ctx sends mpirun SIGTERM, which
// it forwards to every process of the job, and SIGKILL ten seconds later if the job is still running. Unless
// the job runs on other hosts (a hostfile, --host), a program that does not exist or
// is not executable here is a *ProgramError.
func Command(ctx context.Context, procs int, program string, args []string, opts ...Option) (*exec.Cmd, error) {
	return newConfig(opts).command(ctx, procs, program, args)
}

func (c *config) command(ctx context.Context, procs int, program string, args []string) (*exec.Cmd, error) {
	// mpirun passes the hostfile's names to ssh: they are checked before anything runs, mpirun --version
	// included.
	if c.hostfile != "" {
		if _, err := readHostfile(c.hostfile); err != nil {
			return nil, err
		}
	}
	argv, err := c.argv(procs, program, args)
	if err != nil {
		return nil, err
	}
	// mpirun's own control connections use the network here: a name or subnet this machine lacks would
	// fail in mpirun, with its banners.
	if c.network != "" {
		if err := checkLocalNetwork(c.network); err != nil {
			return nil, err
		}
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		return nil, fmt.Errorf("launch: %q: %w", argv[0], ErrMPIRunNotFound)
	}
	// On this machine the program must exist and be executable; on other hosts only they can say.
	if !c.placesOnHosts() {
		if err := CheckProgram(program); err != nil {
			return nil, err
		}
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = c.environ
	cmd.Stdin, cmd.Stdout, cmd.Stderr = c.stdin, c.stdout, c.stderr
	// mpirun cleans up its job on SIGTERM; SIGKILL (exec's default) would orphan the ranks.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	return cmd, nil
}

// Run runs procs copies of program under mpirun, connected to this process's standard streams (or those of
// WithStdio), and returns mpirun's exit code: 0 when every process succeeded, otherwise (for Open MPI and
// MPICH) the code of the first process that failed, or 128+N when mpirun was ended by signal N. SIGINT,
// SIGTERM and SIGHUP received meanwhile are passed on to mpirun, which ends the job, and Run then returns
// 128+N with an *InterruptedError; on Linux the job also ends when the launcher is killed by SIGKILL, which
// it cannot pass on. With WithMaxRestarts, a job whose process failed is started again (see there), and
// the exit code is the last attempt's. Otherwise the error is non-nil only when the job could not be
// started; a *ProgramError carries the code a shell would return for the program (127 not found, 126 not
// executable), and a *HostError names a host of the job that could not be reached (WithHostProbe) or
// whose daemon mpirun could not start or connect.
func Run(ctx context.Context, procs int, program string, args []string, opts ...Option) (exitCode int, err error) {
	c := newConfig(append([]Option{WithStdio(os.Stdin, os.Stdout, os.Stderr)}, opts...))
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(signals)
	// Asked for a hang report: only a launcher that can read the answers listens (the signal's default
	// ends the process).
	var asked chan os.Signal
	if c.hangOut != nil {
		asked = make(chan os.Signal, 1)
		signal.Notify(asked, AskSignal)
		defer signal.Stop(asked)
	}
	var deadline <-chan time.Time
	if c.jobTimeout > 0 {
		timer := time.NewTimer(c.jobTimeout)
		defer timer.Stop()
		deadline = timer.C
	}
	environ := c.environ
	for restarts := 0; ; restarts++ {
		if c.maxRestarts > 0 {
			c.environ = append(slices.Clone(environ), fmt.Sprintf("%s=%d", RestartCountEnvVar, restarts))
		}
		code, failure, err := c.runOnce(ctx, procs, program, args, signals, asked, deadline)
		if failure != nil && restarts == 0 && failure.isUsageError() {
			failure.Usage = true // not restarted: the same command would be refused again
		}
		if err != nil || code == 0 || failure == nil || failure.Usage || restarts >= c.maxRestarts || ctx.Err() != nil {
			if err == nil && code != 0 && failure != nil && c.failureNotice != nil {
				c.failureNotice(*failure)
			}
			return code, err
		}
		notice := Restart{Failure: *failure, Count: restarts + 1, Max: c.maxRestarts}
		if c.restartNotice != nil {
			c.restartNotice(notice)
		} else if c.stderr != nil {
			fmt.Fprintf(c.stderr, "launch: %s\n", notice)
		}
		// A signal that came between the attempts stops the job as one that came during one does.
		select {
		case sig := <-signals:
			return 128 + int(sig.(syscall.Signal)), &InterruptedError{Signal: sig.(syscall.Signal)}
		case <-deadline:
			return JobTimeoutExitCode, &JobTimeoutError{After: c.jobTimeout}
		default:
		}
	}
}

// runOnce runs the job once and returns mpirun's exit code and, when mpirun reported one, the process
// that failed.
func (c *config) runOnce(ctx context.Context, procs int, program string, args []string, signals, asked <-chan os.Signal,
	deadline <-chan time.Time) (int, *Failure, error) {
	watch := failureWatch{namesHosts: c.placesOnHosts()}
	attempt := *c
	attempt.stdout, attempt.stderr = watch.tee(c.stdout), watch.tee(c.stderr)
	cmd, err := attempt.command(ctx, procs, program, args)
	if err != nil {
		return 0, nil, err
	}
	if err := attempt.probeHosts(ctx); err != nil {
		return 1, nil, err
	}
	// A launcher killed by SIGKILL must not leave its job running (Linux: see guardScript).
	cmd = guarded(ctx, cmd)
	if err := cmd.Start(); err != nil {
		return 0, nil, fmt.Errorf("launch: starting %s: %w", cmd.Path, err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	// The hang reports: asked by the user, by a rank whose collective timed out, or by the job's timeout.
	hang := &hangAsker{out: c.hangOut, proc: cmd.Process, ended: make(chan struct{})}
	stalled := make(chan time.Time, 1)
	if c.hangOut != nil {
		c.hangOut.mu.Lock()
		c.hangOut.onStall = func(at time.Time) {
			select {
			case stalled <- at:
			default:
			}
		}
		c.hangOut.mu.Unlock()
	}
	var interrupted os.Signal
	timedOut := false
	for {
		select {
		case sig := <-signals:
			if interrupted == nil {
				interrupted = sig
			}
			_ = cmd.Process.Signal(sig)
		case <-asked:
			hang.ask("asked with SIGUSR1", time.Now())
		case at := <-stalled:
			hang.ask("a rank's collective timed out", at)
		case <-deadline:
			deadline = nil
			timedOut = true
			if c.hangOut != nil {
				hang.ask(fmt.Sprintf("the job ran past its timeout, %s", c.jobTimeout), time.Now())
				hang.wait()
			}
			// As an interrupted launcher does: mpirun ends the job on SIGTERM.
			_ = cmd.Process.Signal(syscall.SIGTERM)
		case err := <-waited:
			close(hang.ended)
			hang.wait()
			if timedOut {
				return JobTimeoutExitCode, nil, &JobTimeoutError{After: c.jobTimeout}
			}
			if sig, ok := interrupted.(syscall.Signal); ok {
				// Whatever mpirun made of it, the job ended because it was asked to: say so, with the code a
				// shell gives a command ended by that signal.
				return 128 + int(sig), nil, &InterruptedError{Signal: sig}
			}
			code := ExitCode(err)
			if f, ok := watch.failure(code); ok && code != 0 {
				return code, &f, nil
			}
			if herr := watch.hostProblem(); herr != nil && code != 0 {
				return code, nil, herr
			}
			return code, nil, nil
		}
	}
}

// InterruptedError is Run's error when the launcher received SIGINT, SIGTERM or SIGHUP and passed it on to
// the job, which then ended; Run's exit code is then 128 plus the signal's number (130 for SIGINT).
type InterruptedError struct {
	Signal syscall.Signal
}

func (e *InterruptedError) Error() string {
	name := map[syscall.Signal]string{syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM", syscall.SIGHUP: "SIGHUP"}[e.Signal]
	if name == "" {
		name = e.Signal.String()
	}
	return fmt.Sprintf("launch: interrupted by %s: the job was stopped", name)
}

// ExitCode converts the error of exec.Cmd.Wait or Run into the exit code a shell would report: 0 for nil,
// the process's exit status, 128+N for death by signal N, and 1 for anything else.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		if code := exitErr.ExitCode(); code >= 0 {
			return code
		}
	}
	return 1
}

// String renders argv as a shell command line, quoting where needed, for printing.
func String(argv []string) string {
	var b bytes.Buffer
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(shellQuote(a))
	}
	return b.String()
}

func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	if strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
