// Command accelbench measures goaccel against the limits that matter, side by side in one run, and writes
// the report docs/benchmarks.md: all-reduce efficiency against plain MPI, gradient bucketing, gradient
// accumulation, the overhead of goaccel's loop against GoMLX's own trainer, and the overlap of bucket
// all-reduces. `make bench` runs it:
//
//	go build -tags mpi -o bin/accelbench ./bench/cmd/accelbench
//	bin/accelbench -out docs/benchmarks.md -json bin/bench.json > bin/bench.txt   # about 3 minutes on 2 cores
//	benchstat bin/bench.txt                                                        # the samples, through benchstat
//	bin/accelbench -render bin/bench.json -out docs/benchmarks.md                  # re-render, no measuring
//
// The multi-process measurements run under mpirun (started through goaccel's launch package, with 2 and 4
// ranks): the command starts itself as the ranks. Standard output carries only benchmark lines in the
// format benchstat reads; progress and MPI's own messages go to standard error. -quick measures
// everything once with tiny sizes, as a smoke test (its numbers mean nothing); -what-if adds a second
// set of mpirun jobs measuring changes before they are made (see bench/fixes.go).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	_ "github.com/goaccel/goaccel/backends/mpi" // the "mpi" engine (with -tags mpi)
	"github.com/goaccel/goaccel/bench"
	"github.com/goaccel/goaccel/launch"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("accelbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "tiny sizes and few samples: a smoke test of the whole pipeline")
	out := fs.String("out", "docs/benchmarks.md", "write the Markdown report to `FILE` (empty: no report)")
	jsonOut := fs.String("json", "", "also write the raw results as JSON to `FILE`")
	ranks := fs.String("ranks", "", "comma-separated world sizes of the MPI measurements (default 2,4; -quick: 2)")
	whatIf := fs.Bool("what-if", false, "also measure the what-if: libnbc's ring algorithm and a wait loop that never sleeps")
	var mpirunArgs stringList
	fs.Var(&mpirunArgs, "mpirun-arg", "pass `ARG` to mpirun (repeatable)")
	render := fs.String("render", "", "measure nothing: render the report from results saved with -json in `FILE`")
	rankJob := fs.String(bench.RankJobFlag, "", "internal: run as a rank of an mpirun job described by `FILE`")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if *rankJob != "" {
		if err := bench.RunRankJob(*rankJob, stderr); err != nil {
			fmt.Fprintf(stderr, "accelbench: rank: %v\n", err)
			return 1
		}
		return 0
	}

	if *render != "" {
		data, err := os.ReadFile(*render)
		if err != nil {
			fmt.Fprintf(stderr, "accelbench: %v\n", err)
			return 1
		}
		var res bench.Results
		if err := json.Unmarshal(data, &res); err != nil {
			fmt.Fprintf(stderr, "accelbench: %s: %v\n", *render, err)
			return 1
		}
		return writeReport(&res, *out, stderr)
	}

	plan := bench.FullPlan()
	if *quick {
		plan = bench.QuickPlan()
	}
	if *ranks != "" {
		plan.Ranks = nil
		for _, s := range strings.Split(*ranks, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 2 {
				fmt.Fprintf(stderr, "accelbench: -ranks: %q is not a world size of at least 2\n", s)
				return 2
			}
			plan.Ranks = append(plan.Ranks, n)
		}
	}
	if *whatIf {
		plan.WhatIf = true
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "accelbench: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d := &bench.Driver{Plan: plan, Executable: exe, Progress: stderr, Benchstat: stdout,
		LaunchOptions: []launch.Option{launch.WithMPIRunArgs(mpirunArgs...)}}
	res, err := d.Run(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "accelbench: %v\n", err)
		return 1
	}
	if *jsonOut != "" {
		data, err := json.MarshalIndent(res, "", "  ")
		if err == nil {
			err = os.WriteFile(*jsonOut, data, 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "accelbench: %v\n", err)
			return 1
		}
	}
	return writeReport(res, *out, stderr)
}

func writeReport(res *bench.Results, path string, stderr io.Writer) int {
	if path == "" {
		return 0
	}
	if err := os.WriteFile(path, []byte(bench.Report(res)), 0o644); err != nil {
		fmt.Fprintf(stderr, "accelbench: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "accelbench: wrote %s\n", path)
	return 0
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, " ") }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}
