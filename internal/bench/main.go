// Package bench measures goaccel side by side with what users compare it to, in one run, and renders
// docs/benchmarks.md; docs/benchmarks-method.md says how and why. Main is the accelbench command
// (internal/bench/cmd/accelbench), which `make bench` runs:
//
//   - all-reduce efficiency against a plain C loop of MPI_Allreduce, bucketing, accumulation and overlap,
//     in mpirun jobs of 2 and 4 ranks (the command starts itself as the ranks);
//   - the overhead of goaccel's loop against GoMLX's train.Trainer, in its own process;
//   - a big MLP's training step under three compute configurations, each in a child process;
//   - the grad_accum demo's job against PyTorch DDP, end to end;
//   - examples/charlm's transformer against its PyTorch twin, end to end;
//   - examples/resnet against its PyTorch twin, end to end, with and without BLAS;
//   - examples/lstm against its PyTorch twin, on one process (reported, no goal);
//   - the demo's CNN without BLAS under each convolution lowering, and the demo's five-epoch wall time;
//   - the demo's job against PyTorch DDP and gradient syncs alone across hosts joined by a network, one
//     process per host, at several link rates: on emulated clusters (network namespaces) it builds itself
//     (root), or on the hosts of -hosts.
//
// With -hosts (and -launch-agent, -net) the mpirun jobs run across those hosts, their mpirun lines built by
// package launch as `accel launch --hosts` builds them.
//
// Every comparison interleaves its variants, so that a shared machine's slow phases hit them alike. Every
// end-to-end PyTorch row runs in PyTorch's fastest configuration on the machine (threads per process, and
// OPENBLAS_CORETYPE as set or unset), chosen by a short calibration before the section's rounds.
// Results are benchstat lines on standard output, a JSON file on request, and the Markdown report.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/goaccel/goaccel/datasets/fashionmnist"
)

// Main runs the accelbench command with args (without the program name) and returns its exit code.
// Standard output carries only lines benchstat reads; progress and the children's output go to stderr.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("accelbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "tiny sizes and few samples: a smoke test of the whole pipeline")
	out := fs.String("out", "docs/benchmarks.md", "write the Markdown report to `FILE` (empty: no report)")
	jsonOut := fs.String("json", "", "also write the results as JSON to `FILE`")
	render := fs.String("render", "", "measure nothing: render the report from results saved with -json in `FILE`")
	scalingPNG := fs.String("scaling-png", "", "also draw the α-β model's projected scaling efficiency (section 6) "+
		"as a PNG in `FILE` (empty: none)")
	only := fs.String("only", allSections(), "measure only these comma-separated `sections`")
	ranks := fs.String("ranks", "", "comma-separated world sizes of the MPI measurements (default 2,4; -quick: 2)")
	limit := fs.Int("limit", -1, "training examples of the end-to-end and ResNet runs (0: all; default all, -quick: 512 and 256)")
	hostList := fs.String("hosts", "", "run the MPI sections and the network section across these hosts, "+
		"`NAME[:SLOTS],...`, with accelbench at the same path on each; mpirun starts here (default: this machine, "+
		"and the network section on emulated clusters)")
	agent := fs.String("launch-agent", "", "with -hosts: the `COMMAND` that runs a command on another host, as "+
		"`COMMAND HOST WORDS...` (default ssh)")
	network := fs.String("net", "", "with -hosts: the network of MPI's traffic (and gloo's), a subnet or interface `NAME`s")
	var setup endToEndSetup
	fs.StringVar(&setup.demo, "demo", "bin/grad_accum", "the grad_accum demo, built with -tags mpi")
	fs.StringVar(&setup.python, "python", "/usr/bin/python3", "the Python with PyTorch")
	fs.StringVar(&setup.dataDir, "data", fashionmnist.DefaultDir, "Fashion-MNIST's IDX files")
	fs.StringVar(&setup.demoPureGo, "demo-purego", "bin/grad_accum_purego", "the grad_accum demo, built without the blas tag")
	fs.StringVar(&setup.demoPureGoRelease, "demo-purego-release", "bin/grad_accum_purego_"+pureGoBaseline,
		"the grad_accum demo of goaccel "+pureGoBaseline+", built without the blas tag from that release's source")
	var lm transformerSetup
	fs.StringVar(&lm.charlm, "charlm", "bin/charlm", "the charlm example, built with -tags mpi")
	fs.StringVar(&lm.corpus, "corpus", "", "the root of the transformer's .go corpus (default: $GOROOT/src)")
	var rn resNetSetup
	fs.StringVar(&rn.resnet, "resnet", "bin/resnet", "the resnet example, built with -tags mpi,blas")
	fs.StringVar(&rn.resnetPureGo, "resnet-purego", "bin/resnet_purego", "the resnet example, built with -tags mpi (no BLAS)")
	var lstm lstmSetup
	fs.StringVar(&lstm.lstm, "lstm", "bin/lstm", "the lstm example, built with -tags mpi,blas")
	overlap := fs.Bool("network-overlap", false, "the network section trains the 1024-wide MLP unthrottled and at "+
		"1 Gbit/s, K=4 and K=1, with goaccel's sync after the step and overlapping the backward pass (accel."+
		"WithOverlap), interleaved over 5 rounds, instead of against PyTorch; no sync-alone measurements")
	rankJob := fs.String(rankJobFlag, "", "internal: run as a rank of the mpirun job described in `JSON`")
	stepJob := fs.String(stepJobFlag, "", "internal: time training steps as described in `JSON`")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "accelbench: %v\n", err)
		return 1
	}
	switch {
	case *rankJob != "":
		if err := runRankJob(*rankJob, stdout, stderr); err != nil {
			return fail(err)
		}
		return 0
	case *stepJob != "":
		if err := runStepJob(*stepJob, stdout); err != nil {
			return fail(err)
		}
		return 0
	case *render != "":
		var res results
		data, err := os.ReadFile(*render)
		if err == nil {
			err = json.Unmarshal(data, &res)
		}
		if err != nil {
			return fail(err)
		}
		if code := writeScaling(&res, *scalingPNG, stderr); code != 0 {
			return code
		}
		return writeReport(&res, *out, stderr)
	}

	p := fullPlan()
	if *quick {
		p = quickPlan()
	}
	if err := p.only(*only); err != nil {
		fmt.Fprintf(stderr, "accelbench: -only: %v\n", err)
		return 2
	}
	if *overlap && len(p.Network.Rates) > 0 {
		p.Network.Impls = []string{"goaccel", "goaccel+overlap"}
		p.Network.Models = []networkModel{{Name: "mlp", Hidden: 1024, Limit: 24576}}
		p.Network.Rates = []int64{0, 1_000_000_000}
		p.Network.Rounds = 5
		p.Network.Syncs = nil
	}
	hosts, err := parseHostSet(*hostList, *agent, *network)
	if err != nil {
		fmt.Fprintf(stderr, "accelbench: -hosts: %v\n", err)
		return 2
	}
	if hosts != nil && len(p.Ranks) > 0 {
		// One job with a process per slot, unless -ranks asks for others.
		if hosts.slots() < 2 {
			fmt.Fprintf(stderr, "accelbench: -hosts %s: the MPI sections need at least 2 slots\n", *hostList)
			return 2
		}
		p.Ranks = []int{hosts.slots()}
	}
	if hosts != nil && len(p.Network.Rates) > 0 && len(hosts.hosts) < 2 {
		fmt.Fprintf(stderr, "accelbench: -hosts %s: the network section needs at least 2 hosts\n", *hostList)
		return 2
	}
	if *ranks != "" && len(p.Ranks) > 0 {
		p.Ranks = nil
		for _, s := range strings.Split(*ranks, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 2 {
				fmt.Fprintf(stderr, "accelbench: -ranks: %q is not a world size of at least 2\n", s)
				return 2
			}
			if hosts != nil && n > hosts.slots() {
				fmt.Fprintf(stderr, "accelbench: -ranks: %d processes do not fit the %d slots of -hosts %s\n", n,
					hosts.slots(), *hostList)
				return 2
			}
			p.Ranks = append(p.Ranks, n)
		}
	}
	if *limit >= 0 {
		p.EndToEnd.Limit, p.ResNet.Limit = *limit, *limit
	}
	exe, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if lm.corpus == "" {
		lm.corpus = defaultCorpus()
	}
	d := &driver{plan: p, exe: exe, progress: stderr, benchstat: stdout, endToEnd: setup, transformer: lm, resNet: rn,
		lstm: lstm, hosts: hosts}
	res, err := d.run(ctx)
	if err != nil {
		return fail(err)
	}
	if *jsonOut != "" {
		if err := writeJSON(*jsonOut, res); err != nil {
			return fail(err)
		}
	}
	if code := writeScaling(res, *scalingPNG, stderr); code != 0 {
		return code
	}
	return writeReport(res, *out, stderr)
}

// writeScaling draws the model's projection to path, when asked; results without it are an error, so that
// a missing image is not a surprise.
func writeScaling(res *results, path string, stderr io.Writer) int {
	if path == "" {
		return 0
	}
	curves, _ := scalingProjection(res)
	if len(curves) == 0 {
		fmt.Fprintf(stderr, "accelbench: -scaling-png: the results hold no α-β model (section 6 with modes and "+
			"all-reduce sizes, unthrottled and throttled)\n")
		return 1
	}
	if err := writeScalingPNG(path, curves, res.Plan.Network); err != nil {
		fmt.Fprintf(stderr, "accelbench: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "accelbench: wrote %s\n", path)
	return 0
}

func writeReport(res *results, path string, stderr io.Writer) int {
	if path == "" {
		return 0
	}
	if err := os.WriteFile(path, []byte(report(res)), 0o644); err != nil {
		fmt.Fprintf(stderr, "accelbench: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "accelbench: wrote %s\n", path)
	return 0
}
