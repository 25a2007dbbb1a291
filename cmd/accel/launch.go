package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/goaccel/goaccel/launch"
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
	procs := fs.Int("n", 1, "number of processes to start")
	hostfile := fs.String("hostfile", "", "run on the hosts listed in `FILE` (mpirun --hostfile)")
	var mpirunArgs stringList
	fs.Var(&mpirunArgs, "mpirun-arg", "pass `ARG` to mpirun before the program (repeatable)")
	mpirun := fs.String("mpirun", "mpirun", "the MPI launcher `program` to run")
	dryRun := fs.Bool("dry-run", false, "print the mpirun command line instead of running it")
	outputDir := fs.String("output-dir", "", "keep every rank's whole output in `DIR`/rank-N.log (default: a "+
		"temporary directory, kept and named only when the job fails)")
	maxRestarts := fs.Int("max-restarts", 0, "start the whole job again, up to `N` times, when one of its processes "+
		"fails or is killed; the program resumes from its checkpoints and reads the count as "+
		launch.RestartCountEnvVar)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: accel launch -n N [flags] [--] PROGRAM [ARGS...]\n\n"+
			"Runs PROGRAM in N processes under mpirun and exits with the job's exit code. With\n"+
			"-max-restarts N, a job whose process fails is started again, up to N times.\n"+
			"Arguments after PROGRAM are passed to it unchanged.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(a.stderr, "accel launch: missing PROGRAM")
		fs.Usage()
		return 2
	}
	if *procs < 1 {
		fmt.Fprintf(a.stderr, "accel launch: -n must be at least 1, got %d\n", *procs)
		return 2
	}
	if *maxRestarts < 0 {
		fmt.Fprintf(a.stderr, "accel launch: -max-restarts must be 0 or more, got %d\n", *maxRestarts)
		return 2
	}
	restarts := 0
	program, programArgs := fs.Arg(0), fs.Args()[1:]
	opts := append([]launch.Option{
		launch.WithMPIRun(*mpirun),
		launch.WithHostfile(*hostfile),
		launch.WithMPIRunArgs(mpirunArgs...),
		launch.WithStdio(a.stdin, a.stdout, a.stderr),
		launch.WithMaxRestarts(*maxRestarts),
		launch.WithRestartNotice(func(r launch.Restart) {
			restarts = r.Count
			fmt.Fprintf(a.stderr, "accel launch: %s\n", r)
		}),
	}, a.launchOptions...)

	if *dryRun {
		argv, err := launch.Argv(*procs, program, programArgs, opts...)
		if err != nil {
			fmt.Fprintf(a.stderr, "accel launch: %v\n", err)
			return 1
		}
		fmt.Fprintln(a.stdout, launch.String(argv))
		return 0
	}
	// Every line comes tagged with its rank: the terminal gets one copy of each error and none of mpirun's
	// banners that restate it; the logs get everything.
	dir, keep := *outputDir, *outputDir != ""
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "accel-launch-"); err != nil {
			fmt.Fprintf(a.stderr, "accel launch: %v\n", err)
			return 1
		}
	}
	out, err := launch.NewOutput(dir, a.stdout, a.stderr)
	if err != nil {
		fmt.Fprintf(a.stderr, "accel launch: %v\n", strings.TrimPrefix(err.Error(), "launch: "))
		return 1
	}
	opts = append(opts, launch.WithTaggedOutput(), launch.WithStdio(a.stdin, out.Stdout(), out.Stderr()))
	code, err := launch.Run(context.Background(), *procs, program, programArgs, opts...)
	_ = out.Close()
	ierr := (*launch.InterruptedError)(nil)
	interrupted := errors.As(err, &ierr)
	if ran := err == nil || interrupted; !keep && !(ran && code != 0) {
		_ = os.RemoveAll(dir) // nothing to look at: the job succeeded, or never started
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
		if summary := out.Summary(); summary != "" {
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
