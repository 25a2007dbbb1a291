package launch

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"sync"
	"syscall"

	"github.com/goaccel/goaccel/internal/jobenv"
)

// RestartCountEnvVar is set in the environment of every process of a job that Run may restart (see
// WithMaxRestarts): the number of times the job was restarted so far (see jobenv.RestartCount).
const RestartCountEnvVar = jobenv.RestartCount

// WithMaxRestarts makes Run start the whole job again, up to n times, when mpirun reports that one of its
// processes failed: exited with a non-zero code, was killed by a signal, or called MPI_Abort. As torchrun
// does, the job is restarted whole — every process, the same command — and it is up to the program to
// resume, from its newest checkpoint; RestartCountEnvVar tells it how many restarts came before. A job the
// launcher was asked to stop (SIGINT, SIGTERM, SIGHUP), a program that cannot be started, an mpirun that
// fails without reporting a failed process (a bad mpirun argument), and a usage error (see
// UsageExitCode) are not restarted.
func WithMaxRestarts(n int) Option { return func(c *config) { c.maxRestarts = n } }

// UsageExitCode is the exit code of a program that refused its command line: Go's flag package exits
// with 2 (flag.ExitOnError), and so do goaccel's programs when a flag is wrong, before they start any
// work. A job whose first run fails because a process exited with this code is a usage error: another run
// of the same command would be refused the same way, so Run does not restart it (Failure.Usage). A
// program must not exit with 2 for any other failure that happens before its first restart can help; on
// a restarted run (the command line was accepted before) 2 is a failure like any other.
const UsageExitCode = 2

// WithRestartNotice calls fn before each restart, instead of Run's default of writing the restart's line
// (Restart.String, after "launch: ") to the job's standard error.
func WithRestartNotice(fn func(Restart)) Option { return func(c *config) { c.restartNotice = fn } }

// WithFailureNotice calls fn with the process whose failure ended the job, as mpirun reported it, when Run
// returns because of it (with WithMaxRestarts: once the restarts are spent). It is not called for a job
// that succeeded, was interrupted, or never started.
func WithFailureNotice(fn func(Failure)) Option { return func(c *config) { c.failureNotice = fn } }

// Restart describes one restart of a job.
type Restart struct {
	// Failure is what ended the attempt before it.
	Failure Failure
	// Count is this restart's number, from 1; Max the number WithMaxRestarts allows.
	Count, Max int
}

// String reads "rank 1 was killed by signal 9; restarting the job (restart 1 of 3)".
func (r Restart) String() string {
	return fmt.Sprintf("%s; restarting the job (restart %d of %d)", r.Failure, r.Count, r.Max)
}

// Failure is a failed process of a job, as mpirun reported it.
type Failure struct {
	// Rank is the failed process's rank, -1 when mpirun did not say.
	Rank int
	// Host is the host it ran on, as mpirun named it, for jobs on several hosts; empty otherwise.
	Host string
	// Signal is the signal that killed it, or 0; ExitCode its exit code otherwise.
	Signal   syscall.Signal
	ExitCode int
	// Aborted says that the process called MPI_Abort (with ExitCode as its error code).
	Aborted bool
	// Usage says that this was the job's first run and the process exited with UsageExitCode: the program
	// refused its command line, and Run did not restart the job.
	Usage bool
	// Crash is the first line of the Go crash report the process wrote before it ended ("panic: …",
	// "SIGSEGV: segmentation violation"), empty when it wrote none. Go's runtime exits with 2 after a
	// crash report, as the flag package does after a usage error: a process that crashed is no usage error.
	Crash string
}

// isUsageError reports whether f, on a job's first run, is a usage error (see UsageExitCode).
func (f Failure) isUsageError() bool {
	return f.Signal == 0 && !f.Aborted && f.ExitCode == UsageExitCode && f.Crash == ""
}

func (f Failure) String() string {
	who := "a process"
	if f.Rank >= 0 {
		who = "rank " + strconv.Itoa(f.Rank)
	}
	if f.Host != "" {
		who += " on host " + f.Host
	}
	switch {
	case f.Signal != 0:
		return fmt.Sprintf("%s was killed by signal %d (%s)", who, int(f.Signal), f.Signal)
	case f.Aborted:
		return fmt.Sprintf("%s called MPI_Abort with error code %d", who, f.ExitCode)
	case f.Usage:
		return fmt.Sprintf("%s exited with code %d, a usage error: the program refused its command line, and "+
			"running it again would not help", who, f.ExitCode)
	case f.Crash != "":
		return fmt.Sprintf("%s crashed (%s) and exited with code %d", who, f.Crash, f.ExitCode)
	}
	return fmt.Sprintf("%s exited with code %d", who, f.ExitCode)
}

// failureReports are the lines in which mpirun says which process failed first. Open MPI 4 ("mpirun
// noticed…", or a "Process name: [[job,1],rank]" line followed by "Exit code: N") and 5 ("prterun
// noticed…"); MPICH's Hydra ("RANK r PID p RUNNING AT host" then "KILLED BY SIGNAL: n" or "EXIT CODE: n").
var (
	noticedSignal = regexp.MustCompile(`noticed that process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)`)
	noticedExit   = regexp.MustCompile(`noticed that process rank (\d+) with PID \d+ on node (\S+) exited with status (\d+)`)
	processName   = regexp.MustCompile(`Process name:\s*\[\[\d+,\d+\],(\d+)\]`)
	exitCodeLine  = regexp.MustCompile(`^\s*Exit code:\s*(\d+)`)
	hydraRank     = regexp.MustCompile(`RANK (\d+) PID \d+ RUNNING AT (\S+)`)
	hydraSignal   = regexp.MustCompile(`KILLED BY SIGNAL: (\d+)`)
	hydraExit     = regexp.MustCompile(`EXIT CODE: (\d+)`)
	mpiAbort      = regexp.MustCompile(`MPI_ABORT was invoked on rank (\d+) in communicator \S+ with errorcode (-?\d+)`)
	// primaryJob is Open MPI's banner for a job whose process failed, which it prints even when the
	// process's own report does not come (a process killed while the others were exiting).
	primaryJob = regexp.MustCompile(`Primary job\s+terminated normally, but \d+ process(es)? returned`)
)

// failureWatch reads a job's output lines for mpirun's report of the process that failed. mpirun's own
// verdict wins over an MPI_Abort line, which a process that learnt of another's failure may print first.
type failureWatch struct {
	mu      sync.Mutex
	verdict *Failure
	aborted *Failure
	// unnamed: mpirun said that a process failed, without saying which.
	unnamed bool
	// pending is a failure whose rank was read and whose code comes on a later line.
	pending *Failure
	// namesHosts: the job runs on several hosts, and failures say on which.
	namesHosts bool
	// crashStart is, per rank (-1: untagged output), the first line of a Go crash report being read, and
	// crashes those whose goroutine stacks followed: the first line of each process's crash report.
	crashStart, crashes map[int]string
	hostWatch
}

// host is mpirun's name for a failed process's node, kept for jobs on several hosts.
func (w *failureWatch) host(name string) string {
	if w.namesHosts {
		return name
	}
	return ""
}

func (w *failureWatch) line(line string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	set := func(f Failure) {
		if w.verdict == nil {
			w.verdict = &f
		}
		w.pending = nil
	}
	// pendingOr is the failure whose rank an earlier line gave, or one of unknown rank.
	pendingOr := func() Failure {
		if w.pending != nil {
			return *w.pending
		}
		return Failure{Rank: -1}
	}
	w.hostLine(line)
	w.crashLine(line)
	if m := noticedSignal.FindStringSubmatch(line); m != nil {
		set(Failure{Rank: atoi(m[1]), Host: w.host(m[2]), Signal: syscall.Signal(atoi(m[3]))})
	} else if m := noticedExit.FindStringSubmatch(line); m != nil {
		set(Failure{Rank: atoi(m[1]), Host: w.host(m[2]), ExitCode: atoi(m[3])})
	} else if m := processName.FindStringSubmatch(line); m != nil {
		w.pending = &Failure{Rank: atoi(m[1])}
	} else if m := hydraRank.FindStringSubmatch(line); m != nil {
		w.pending = &Failure{Rank: atoi(m[1]), Host: w.host(m[2])}
	} else if m := exitCodeLine.FindStringSubmatch(line); m != nil && w.pending != nil {
		f := pendingOr()
		f.ExitCode = atoi(m[1])
		set(f)
	} else if m := hydraSignal.FindStringSubmatch(line); m != nil {
		f := pendingOr()
		f.Signal = syscall.Signal(atoi(m[1]))
		set(f)
	} else if m := hydraExit.FindStringSubmatch(line); m != nil {
		f := pendingOr()
		f.ExitCode = atoi(m[1])
		set(f)
	} else if m := mpiAbort.FindStringSubmatch(line); m != nil && w.aborted == nil {
		w.aborted = &Failure{Rank: atoi(m[1]), ExitCode: atoi(m[2]), Aborted: true}
	} else if primaryJob.MatchString(line) {
		w.unnamed = true
	}
}

// crashLine reads a line for a Go crash report: its first line, confirmed by a goroutine's stack after it.
func (w *failureWatch) crashLine(line string) {
	rank, text := -1, line
	if m := tagged.FindStringSubmatch(line); m != nil {
		rank, _ = strconv.Atoi(m[1])
		text = m[3]
	}
	if w.crashStart == nil {
		w.crashStart, w.crashes = map[int]string{}, map[int]string{}
	}
	switch {
	case w.crashStart[rank] == "" && goCrashStart.MatchString(text):
		w.crashStart[rank] = text
	case w.crashStart[rank] != "" && w.crashes[rank] == "" && goroutineHeader.MatchString(text):
		w.crashes[rank] = w.crashStart[rank]
	}
}

// crashOf is the first line of the crash report of the process of rank, or, when rank is unknown (-1)
// or the output untagged, of the one crash report seen.
func (w *failureWatch) crashOf(rank int) string {
	if c := w.crashes[rank]; c != "" {
		return c
	}
	if c := w.crashes[-1]; c != "" {
		return c // untagged output
	}
	if rank < 0 && len(w.crashes) == 1 {
		for _, c := range w.crashes {
			return c
		}
	}
	return ""
}

// failure is the failed process the output reported, if any; exitCode is mpirun's, which tells how a
// process mpirun did not name ended (128+N: by signal N).
func (w *failureWatch) failure(exitCode int) (Failure, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f, ok := w.reported(exitCode)
	if ok && f.Signal == 0 {
		f.Crash = w.crashOf(f.Rank)
	}
	return f, ok
}

// reported is the failed process mpirun reported (see failure).
func (w *failureWatch) reported(exitCode int) (Failure, bool) {
	switch {
	case w.verdict != nil:
		return *w.verdict, true
	case w.aborted != nil:
		return *w.aborted, true
	case w.unnamed && exitCode > 128:
		return Failure{Rank: -1, Signal: syscall.Signal(exitCode - 128)}, true
	case w.unnamed:
		return Failure{Rank: -1, ExitCode: exitCode}, true
	}
	return Failure{}, false
}

// hostProblem is the host mpirun reported it could not start or connect a daemon on, if any.
func (w *failureWatch) hostProblem() *HostError {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hostFailure()
}

// tee passes a stream on to w unchanged and shows the watch its lines.
func (w *failureWatch) tee(out io.Writer) io.Writer {
	if out == nil {
		out = io.Discard
	}
	return &teeLines{out: out, lines: lineWriter{emit: w.line}}
}

type teeLines struct {
	out   io.Writer
	lines lineWriter
}

func (t *teeLines) Write(p []byte) (int, error) {
	_, _ = t.lines.Write(p)
	return t.out.Write(p)
}
