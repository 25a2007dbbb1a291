package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
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
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: accel launch -n N [flags] [--] PROGRAM [ARGS...]\n\n"+
			"Runs PROGRAM in N processes under mpirun and exits with the job's exit code.\n"+
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
	program, programArgs := fs.Arg(0), fs.Args()[1:]
	opts := append([]launch.Option{
		launch.WithMPIRun(*mpirun),
		launch.WithHostfile(*hostfile),
		launch.WithMPIRunArgs(mpirunArgs...),
		launch.WithStdio(a.stdin, a.stdout, a.stderr),
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
	code, err := launch.Run(context.Background(), *procs, program, programArgs, opts...)
	if ierr := (*launch.InterruptedError)(nil); errors.As(err, &ierr) {
		fmt.Fprintf(a.stderr, "accel launch: %v\n", err)
		return code // 130 for SIGINT, 143 for SIGTERM, as a shell reports
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "accel launch: %v\n", err)
		// A program that cannot run gets a shell's code (127, 126), not mpirun's, which read as signals.
		var perr *launch.ProgramError
		if errors.As(err, &perr) {
			return perr.Code
		}
		return 1
	}
	return code
}
