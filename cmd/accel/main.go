// Command accel starts goaccel programs on one or more processes and describes the environment they would
// run in, like Hugging Face's `accelerate launch` and `accelerate env`.
//
// Usage:
//
//	accel launch [-n N] [--hosts NAME:SLOTS,... | --hostfile FILE] [--net NETWORK] [--launch-agent COMMAND] [--env NAME ...]
//	             [--check] [--mpirun-arg ARG ...] [--mpirun PROGRAM] [--max-restarts N] [--dry-run] [--] PROGRAM [ARGS...]
//	accel launch --check [--hosts NAME:SLOTS,...] [flags]
//	accel env [--devices]
//
// `accel launch` runs PROGRAM in N processes under mpirun, adding the flags a Go program needs (see package
// launch: --allow-run-as-root as root, --oversubscribe beyond the core count, --bind-to none, and the Open MPI
// MCA settings this machine needs), and exits with the job's exit code. Everything after PROGRAM is passed
// to it unchanged; --dry-run prints the mpirun command instead of running it. On several hosts (--hosts
// node1:4,node2:4, a hostfile, or inside a Slurm allocation its hosts) it starts one process per slot
// unless -n says fewer; goaccel's, GoMLX's and PJRT's variables and CUDA_VISIBLE_DEVICES reach every host
// (--env NAME adds more); --net keeps MPI's data and control traffic on one network, --launch-agent starts
// the remote daemons with another command than ssh, and a host that cannot be reached is named before
// anything starts; several hosts that name this machine (127.0.0.1, 127.0.0.2) are said to be one machine,
// and their processes talk over TCP. --check first runs a short job across the hosts (every process
// reports its host, goaccel version and MPI library; timed all-reduces report the bandwidth) and stops
// there when the builds differ, a process fails (its crash report's lines that matter are quoted, and its
// whole output kept in the output directory's check/), or without a PROGRAM. As the job starts, each
// process's host and PID are listed, and written to the output directory's ranks.txt. With --max-restarts N (torchrun's
// flag), a job one of whose processes fails or is killed is started again, whole, up to N times; the
// launcher says which rank failed and the restart count, and the program, which reads the count as
// GOACCEL_RESTART_COUNT (Accelerator.RestartCount), resumes from its newest checkpoint. The program must be
// built with `-tags mpi` to talk across processes.
//
// `accel env` prints what goaccel sees: its version, Go, the platform, the topology from the launcher's
// environment, the collective engines linked into this binary and the MPI library, the mpirun that launch
// would use, and the GoMLX compute backend that would be chosen. It never downloads anything. Paste its
// output into bug reports.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/goaccel/goaccel/internal/launch"
)

func main() {
	a := &app{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr}
	os.Exit(a.run(os.Args[1:]))
}

// app is the command with its streams and, for tests, the launch options that pin machine detection.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	launchOptions  []launch.Option
}

const usage = `accel starts goaccel programs on several processes and describes their environment.

Usage:
  accel launch [-n N] [--hosts NAME:SLOTS,... | --hostfile FILE] [--net NETWORK] [--launch-agent COMMAND]
               [--env NAME ...] [--check] [--mpirun-arg ARG ...] [--max-restarts N] [--dry-run] [--] PROGRAM [ARGS...]
  accel launch --check [--hosts NAME:SLOTS,...] [flags]
  accel env [--devices]

Run "accel launch -h" or "accel env -h" for the flags of each command.
`

// run executes the command line and returns the process exit code: 2 for usage errors, as the flag
// package does.
func (a *app) run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(a.stderr, usage)
		return 2
	}
	switch args[0] {
	case "launch":
		return a.launch(args[1:])
	case "env":
		return a.env(args[1:])
	case checkRankCommand: // not in the usage: what `accel launch --check` starts in each process
		return a.checkRank(args[1:])
	case "help", "-h", "-help", "--help":
		fmt.Fprint(a.stdout, usage)
		return 0
	}
	fmt.Fprintf(a.stderr, "accel: unknown command %q\n\n%s", args[0], usage)
	return 2
}
