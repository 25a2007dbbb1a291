package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/backends/mpi"
	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/launch/rankcheck"
	"github.com/goaccel/goaccel/version"
)

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, " ") }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

func (a *app) launch(args []string) int {
	fs := flag.NewFlagSet("accel launch", flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	procs := fs.Int("n", 0, "number of processes to start (default: 1 on this machine; one per slot with --hosts, "+
		"a hostfile or a Slurm allocation)")
	hosts := fs.String("hosts", "", "run on these hosts: `NAME[:SLOTS],...` (node1:4,node2:4; slots 1 when left out)")
	hostfile := fs.String("hostfile", "", "run on the hosts listed in `FILE` (mpirun --hostfile)")
	network := fs.String("net", "", "keep MPI's data and control traffic on this `NETWORK`: a subnet (10.0.0.0/24) or an "+
		"interface (eth0)")
	agent := fs.String("launch-agent", "", "start mpirun's daemons on the other hosts with `COMMAND` instead of ssh "+
		"(\"ssh -p 2222\", or a script run as `COMMAND HOST WORDS...`)")
	var forward stringList
	fs.Var(&forward, "env", "also pass `NAME` (or NAME=VALUE) to every process on every host (repeatable; "+
		"GOACCEL_*, GOMLX_*, PJRT_* and CUDA_VISIBLE_DEVICES are passed already)")
	check := fs.Bool("check", false, "first run a short check across the hosts: each process's host, goaccel version and "+
		"MPI library, and the all-reduce bandwidth; without PROGRAM, only the check")
	checkTimeout := fs.Duration("check-timeout", 3*time.Minute, "give up the check after `DURATION`")
	var mpirunArgs stringList
	fs.Var(&mpirunArgs, "mpirun-arg", "pass `ARG` to mpirun before the program (repeatable)")
	mpirun := fs.String("mpirun", "mpirun", "the MPI launcher `program` to run")
	dryRun := fs.Bool("dry-run", false, "print the mpirun command line instead of running it")
	outputDir := fs.String("output-dir", "", "keep every rank's whole output in `DIR`/rank-N.log, the processes' "+
		"hosts and PIDs in DIR/ranks.txt, and --check's output in DIR/check/ (default: a temporary directory, kept and "+
		"named only when the job or the check fails)")
	maxRestarts := fs.Int("max-restarts", 0, "start the whole job again, up to `N` times, when one of its processes "+
		"fails or is killed; the program resumes from its checkpoints and reads the count as "+
		launch.RestartCountEnvVar)
	timeout := fs.Duration("timeout", 0, "stop the job once it has run for `DURATION` (0: no limit), after a hang report "+
		"of what each rank is doing; exits with code 124. kill -USR1 asks for the report of a running job")
	timeline := fs.String("timeline", "", "record the job's timeline into `FILE`, a trace for Perfetto or chrome://tracing: "+
		"each process's micro-batches, gradient all-reduces, optimizer steps, loading and checkpoints (sets "+
		"GOACCEL_TIMELINE for every process)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: accel launch [-n N] [--hosts NAME:SLOTS,...] [flags] [--] PROGRAM [ARGS...]\n"+
			"       accel launch --check [--hosts NAME:SLOTS,...] [flags] [-- PROGRAM [ARGS...]]\n\n"+
			"Runs PROGRAM in N processes under mpirun, on this machine or on the hosts given (--hosts, --hostfile,\n"+
			"or a Slurm allocation's), and exits with the job's exit code. With -max-restarts N, a job whose\n"+
			"process fails is started again, up to N times. Arguments after PROGRAM are passed to it unchanged.\n\n"+
			"Flags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 && !*check {
		fmt.Fprintln(a.stderr, "accel launch: missing PROGRAM")
		fs.Usage()
		return 2
	}
	nGiven := false
	fs.Visit(func(f *flag.Flag) { nGiven = nGiven || f.Name == "n" })
	if nGiven && *procs < 1 {
		fmt.Fprintf(a.stderr, "accel launch: -n must be at least 1, got %d\n", *procs)
		return 2
	}
	if *maxRestarts < 0 {
		fmt.Fprintf(a.stderr, "accel launch: -max-restarts must be 0 or more, got %d\n", *maxRestarts)
		return 2
	}
	if *timeout < 0 {
		fmt.Fprintf(a.stderr, "accel launch: -timeout must be 0 (no limit) or positive, got %s\n", *timeout)
		return 2
	}
	if *checkTimeout <= 0 {
		fmt.Fprintf(a.stderr, "accel launch: -check-timeout must be positive, got %s\n", *checkTimeout)
		return 2
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	// An empty value would silently mean "this machine alone": a variable that was meant to hold the hosts
	// and is empty must not start a one-process local job.
	if given["hostfile"] && strings.TrimSpace(*hostfile) == "" {
		fmt.Fprintln(a.stderr, "accel launch: --hostfile is empty: name a file of hosts, or leave --hostfile out to run "+
			"on this machine")
		return 2
	}
	if given["hosts"] && strings.TrimSpace(*hosts) == "" {
		fmt.Fprintln(a.stderr, "accel launch: --hosts is empty: write NAME[:SLOTS],... (node1:4,node2:4), or leave "+
			"--hosts out to run on this machine")
		return 2
	}
	var hostList []launch.Host
	if given["hosts"] {
		var err error
		if hostList, err = launch.ParseHosts(*hosts); err != nil {
			fmt.Fprintf(a.stderr, "accel launch: --hosts: %v\n", strings.TrimPrefix(err.Error(), "launch: "))
			return 2
		}
	}
	restarts := 0
	// A notice about the hosts comes from the check and from the job: it is said once.
	noticed := map[string]bool{}
	// The job's output, once it is started: a restart's processes announce themselves anew.
	var out *launch.Output
	opts := append([]launch.Option{
		launch.WithMPIRun(*mpirun),
		launch.WithHosts(hostList...),
		launch.WithHostfile(*hostfile),
		launch.WithNetwork(*network),
		launch.WithLaunchAgent(*agent),
		launch.WithForwardEnv(forward...),
		launch.WithMPIRunArgs(mpirunArgs...),
		launch.WithStdio(a.stdin, a.stdout, a.stderr),
		launch.WithMaxRestarts(*maxRestarts),
		launch.WithTimeline(*timeline),
		launch.WithRestartNotice(func(r launch.Restart) {
			restarts = r.Count
			fmt.Fprintf(a.stderr, "accel launch: %s\n", r)
			if out != nil {
				out.Restarted()
			}
		}),
		launch.WithNotice(func(notice string) {
			if !noticed[notice] {
				noticed[notice] = true
				fmt.Fprintf(a.stderr, "accel launch: %s\n", notice)
			}
		}),
	}, a.launchOptions...)

	// Every line comes tagged with its rank: the terminal gets one copy of each error and none of mpirun's
	// banners that restate it; the logs get everything, the check's too.
	dir, keep := *outputDir, *outputDir != ""
	if !*dryRun && dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "accel-launch-"); err != nil {
			fmt.Fprintf(a.stderr, "accel launch: %v\n", err)
			return 1
		}
	}
	if *check {
		code := a.check(*procs, *checkTimeout, *dryRun, filepath.Join(dir, "check"), opts)
		if !*dryRun && !keep && (code == 0 && fs.NArg() == 0 || code != 0 && !logsWritten(filepath.Join(dir, "check"))) {
			_ = os.RemoveAll(dir) // nothing to look at: the check succeeded and is all, or never started
		}
		if code != 0 || fs.NArg() == 0 {
			return code
		}
	}
	program, programArgs := fs.Arg(0), fs.Args()[1:]
	if *dryRun {
		argv, err := launch.Argv(*procs, program, programArgs, opts...)
		if err != nil {
			fmt.Fprintf(a.stderr, "accel launch: %v\n", strings.TrimPrefix(err.Error(), "launch: "))
			return 1
		}
		fmt.Fprintln(a.stdout, launch.String(argv))
		return 0
	}
	out, err := launch.NewOutput(dir, a.stdout, a.stderr)
	if err != nil {
		fmt.Fprintf(a.stderr, "accel launch: %v\n", strings.TrimPrefix(err.Error(), "launch: "))
		return 1
	}
	// Each process says its host and PID as it starts, for whoever wants to signal or profile one.
	out.OnRanks(func(procs []launch.RankProcess, file string) {
		fmt.Fprintf(a.stderr, "accel launch: the job's %d process(es), as they started (also in %s):\n%s", len(procs),
			file, launch.RankTable(procs))
	})
	opts = append(opts, launch.WithTaggedOutput(), launch.WithRankAnnouncements(),
		launch.WithStdio(a.stdin, out.Stdout(), out.Stderr()), launch.WithHangReports(out),
		launch.WithJobTimeout(*timeout))
	var failure *launch.Failure
	opts = append(opts, launch.WithFailureNotice(func(f launch.Failure) { failure = &f }))
	code, err := launch.Run(context.Background(), *procs, program, programArgs, opts...)
	_ = out.Close()
	ierr := (*launch.InterruptedError)(nil)
	interrupted := errors.As(err, &ierr)
	terr := (*launch.JobTimeoutError)(nil)
	timedOut := errors.As(err, &terr)
	if ran := err == nil || interrupted || timedOut; !keep && !(ran && code != 0) {
		_ = os.RemoveAll(dir) // nothing to look at: the job succeeded, or never started
	}
	if timedOut {
		// The hang report is above; the ranks' whole reports, stacks included, are in their logs.
		fmt.Fprintf(a.stderr, "accel launch: the job ran past -timeout %s and was stopped (every rank's whole "+
			"output: %s)\n", terr.After, filepath.Join(dir, "rank-N.log"))
		return code
	}
	if interrupted {
		fmt.Fprintf(a.stderr, "accel launch: %v\n", strings.TrimPrefix(err.Error(), "launch: "))
		return code // 130 for SIGINT, 143 for SIGTERM, as a shell reports
	}
	if err == nil && code != 0 {
		failed := fmt.Sprintf("the job failed (exit code %d)", code)
		if restarts > 0 {
			failed = fmt.Sprintf("the job failed (exit code %d) after %d restart(s)", code, restarts)
		}
		if failure != nil {
			failed += ": " + failure.String()
		}
		if failure != nil && failure.Usage {
			// The program's words (a usage text, often long) were shown once already, live: not again.
			fmt.Fprintf(a.stderr, "accel launch: %s (its words are above; every rank's whole output: %s)\n", failed,
				filepath.Join(dir, "rank-N.log"))
		} else if summary := out.Summary(); summary != "" {
			fmt.Fprintf(a.stderr, "accel launch: %s; what the ranks reported:\n%s", failed, summary)
		} else {
			fmt.Fprintf(a.stderr, "accel launch: %s; mpirun's output: %s\n", failed, filepath.Join(dir, "mpirun.log"))
		}
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "accel launch: %v\n", strings.TrimPrefix(err.Error(), "launch: "))
		// A program that cannot run gets a shell's code (127, 126), not mpirun's, which read as signals.
		var perr *launch.ProgramError
		if errors.As(err, &perr) {
			return perr.Code
		}
		return 1
	}
	return code
}

// checkRankCommand is the hidden command that mpirun starts in every process of `accel launch --check`.
const checkRankCommand = "check-rank"

// check runs `accel launch --check`: this binary's check-rank command in procs processes with the job's
// options, keeping their output in logs, and prints the report (or, with dryRun, the command line). It
// returns the exit code.
func (a *app) check(procs int, timeout time.Duration, dryRun bool, logs string, opts []launch.Option) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(a.stderr, "accel launch: --check: locating accel itself: %v\n", err)
		return 1
	}
	args := []string{checkRankCommand, "-timeout", timeout.String()}
	if dryRun {
		// The check tags every line with its rank, as launch.Check runs it.
		argv, err := launch.Argv(procs, self, args, append(opts, launch.WithTaggedOutput())...)
		if err != nil {
			fmt.Fprintf(a.stderr, "accel launch: %v\n", strings.TrimPrefix(err.Error(), "launch: "))
			return 1
		}
		fmt.Fprintln(a.stdout, launch.String(argv))
		return 0
	}
	if !backends.EngineRegistered("mpi") {
		fmt.Fprintln(a.stderr, "accel launch: --check needs an accel built with -tags mpi (go install -tags mpi ./cmd/accel): "+
			"its processes run the check through MPI")
		return 1
	}
	ctx, cancel := context.WithTimeoutCause(context.Background(), timeout,
		fmt.Errorf("no result within -check-timeout %s", timeout))
	defer cancel()
	report, err := launch.Check(ctx, procs, self, args, append(opts, launch.WithCheckLogs(logs))...)
	if report != nil {
		fmt.Fprint(a.stdout, "accel launch --check: ", report)
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "accel launch: --check: %v\n", strings.TrimPrefix(err.Error(), "launch: "))
		return 1
	}
	return 0
}

// checkRank is one process of `accel launch --check`: it opens the MPI engine and runs launch.CheckRank.
func (a *app) checkRank(args []string) int {
	fs := flag.NewFlagSet("accel "+checkRankCommand, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	timeout := fs.Duration("timeout", 3*time.Minute, "bound every collective to `DURATION`")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	topo, err := backends.DetectTopology()
	if err != nil {
		fmt.Fprintf(a.stderr, "accel %s: %v\n", checkRankCommand, err)
		return 1
	}
	comm, err := backends.Open("mpi", topo, backends.WithTimeout(*timeout))
	if err != nil {
		fmt.Fprintf(a.stderr, "accel %s: rank %d: %v\n", checkRankCommand, topo.Rank, err)
		return 1
	}
	info := launch.CheckInfo{GoaccelVersion: version.String(), MPILibrary: firstLine(mpi.LibraryVersion())}
	if err := rankcheck.Run(comm, info, a.stdout); err != nil {
		fmt.Fprintf(a.stderr, "accel %s: rank %d: %v\n", checkRankCommand, topo.Rank, err)
		comm.Abort(1)
		return 1
	}
	if err := comm.Close(); err != nil {
		fmt.Fprintf(a.stderr, "accel %s: rank %d: %v\n", checkRankCommand, topo.Rank, err)
		return 1
	}
	return 0
}

// logsWritten reports whether the directory of a check's logs holds anything: a process or mpirun wrote.
func logsWritten(dir string) bool {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Size() > 0 {
			return true
		}
	}
	return false
}
