package bench

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/goaccel/goaccel/internal/launch"
)

// resNetPlan is examples/resnet's job, run by goaccel's program built with BLAS and without it and by its
// PyTorch twin: the same model (width, blocks, dropout), initialisation, Adam learning rate, per-process
// batch, K and epochs, with 1 and more processes.
type resNetPlan struct {
	// Rounds are the runs of each variant (0: skip the section); round r trains every variant from seed
	// Seed + r, so that accuracies are medians over seeds.
	Rounds        int
	Procs         []int
	Width, Blocks int
	Dropout       float64
	Epochs, Batch int
	K             int
	LR            float64
	Seed          int
	Limit         int // training examples (0: all 60000)
}

// args are the job's flags in a program's syntax ("-" for Go, "--" for Python), training from seed.
func (p resNetPlan) args(dash, dataDir string, seed int) []string {
	flags := []struct {
		name  string
		value any
	}{{"width", p.Width}, {"blocks", p.Blocks}, {"dropout", p.Dropout}, {"epochs", p.Epochs}, {"batch", p.Batch},
		{"k", p.K}, {"lr", p.LR}, {"seed", seed}, {"limit", p.Limit}, {"data", dataDir}}
	var out []string
	for _, f := range flags {
		out = append(out, dash+f.name, fmt.Sprint(f.value))
	}
	return out
}

//go:embed pytorch/resnet_ddp.py
var resNetScript []byte

// resNetSetup is where the programs of the section are.
type resNetSetup struct {
	resnet       string // examples/resnet built with -tags mpi,blas
	resnetPureGo string // examples/resnet built with -tags mpi: every product and convolution in pure Go
	script       string // the PyTorch twin, written out by check
}

// check fails early, with what to do, when a program is missing, and writes the PyTorch twin into dir.
// PyTorch itself is checked with the demo's section (checkPyTorch).
func (s *resNetSetup) check(dir string) error {
	for _, program := range []struct{ path, tags string }{{s.resnet, "mpi,blas"}, {s.resnetPureGo, "mpi"}} {
		if _, err := os.Stat(program.path); err != nil {
			return fmt.Errorf("the resnet section runs examples/resnet: %w (build it with `go build -tags %s -o %s "+
				"./examples/resnet`, or leave resnet out of -only)", err, program.tags, program.path)
		}
	}
	s.script = filepath.Join(dir, "resnet_ddp.py")
	return os.WriteFile(s.script, resNetScript, 0o644)
}

// The ResNet's implementations: goaccel's program with BLAS (as `make build` builds it), the same without
// the blas tag, and the PyTorch twin.
const (
	implGoaccel       = "goaccel"
	implGoaccelPureGo = "goaccel-purego"
	implPyTorch       = "pytorch"
)

var resNetImpls = []string{implGoaccel, implGoaccelPureGo, implPyTorch}

// measureResNet runs every implementation and process count once per round, in an order that changes from
// round to round, PyTorch in the configuration its calibration chose. The results are endToEndResults of
// model "resnet".
func (d *driver) measureResNet(ctx context.Context) ([]endToEndResult, error) {
	p := d.plan.ResNet
	if p.Rounds == 0 {
		return nil, nil
	}
	var runs []endToEndResult
	for _, impl := range resNetImpls {
		for _, n := range p.Procs {
			runs = append(runs, endToEndResult{Impl: impl, Model: "resnet", Procs: n,
				PerExample: series{Name: fmt.Sprintf("ResNet/impl=%s/procs=%d", impl, n)}})
		}
	}
	for i := range runs {
		if r := &runs[i]; r.Impl == implPyTorch {
			var err error
			if r.PyTorch, err = d.calibrateResNet(ctx, r.Procs); err != nil {
				return nil, fmt.Errorf("resnet with pytorch on %s: %w", processes(r.Procs), err)
			}
		}
	}
	for round := range p.Rounds {
		for _, i := range rand.New(rand.NewPCG(uint64(round), 0x7e5)).Perm(len(runs)) {
			r := &runs[i]
			d.progressf("resnet: %s, %s (round %d of %d)\n", r.Impl, processes(r.Procs), round+1, p.Rounds)
			s, err := d.runResNet(ctx, p, r.Impl, r.Procs, p.Seed+round, d.torchConfigOf(r.PyTorch, r.Procs))
			if err != nil {
				return nil, fmt.Errorf("resnet with %s on %s: %w", r.Impl, processes(r.Procs), err)
			}
			r.PerExample.Iters = s.TrainExamples * s.Epochs
			r.PerExample.Seconds = append(r.PerExample.Seconds, 1/s.ExamplesPerSecond)
			r.TestAccuracy = append(r.TestAccuracy, s.TestAccuracy)
			r.Parameters = s.Parameters
		}
	}
	for _, r := range runs {
		d.emit(r.PerExample)
	}
	return runs, nil
}

// resNetCheck is when PyTorch computes the ResNet's job correctly without OPENBLAS_CORETYPE: the accuracy
// goal's tolerance.
var resNetCheck = qualityCheck{Name: "test accuracy", Tolerance: goalResNetAccuracyGap}

// calibrationJob is the ResNet's job of a calibration run: at most the calibration's examples.
func (p resNetPlan) calibrationJob(c calibrationPlan) resNetPlan {
	p.Limit = shorter(p.Limit, c.Examples)
	return p
}

// calibrateResNet chooses PyTorch's configuration for the ResNet on procs processes.
func (d *driver) calibrateResNet(ctx context.Context, procs int) (*torchChoice, error) {
	p := d.plan.ResNet
	job := p.calibrationJob(d.plan.Calibration)
	return d.choosePyTorch(ctx, "resnet: "+processes(procs), procs, examplesOf(job.Limit)*job.Epochs, resNetCheck,
		func(ctx context.Context, cfg torchConfig) (float64, float64, error) {
			s, err := d.runResNet(ctx, job, implPyTorch, procs, p.Seed, cfg)
			if err != nil {
				return 0, 0, err
			}
			return 1 / s.ExamplesPerSecond, s.TestAccuracy, nil
		})
}

// runResNet trains the job p once from seed, PyTorch in configuration torch, and returns the summary the
// program ends its output with.
func (d *driver) runResNet(ctx context.Context, p resNetPlan, impl string, procs, seed int, torch torchConfig) (runSummary, error) {
	s := d.resNet
	ctx, cancel := context.WithTimeout(ctx, d.plan.JobTimeout)
	defer cancel()
	program := s.resnet
	if impl == implGoaccelPureGo {
		program = s.resnetPureGo
	}
	args := append(p.args("-", d.endToEnd.dataDir, seed), "-quiet")
	var cmd *exec.Cmd
	switch {
	case impl == implPyTorch:
		cmd = d.pytorchCommand(ctx, s.script, procs, torch, p.args("--", d.endToEnd.dataDir, seed))
	case procs == 1:
		cmd = exec.CommandContext(ctx, program, args...)
	default:
		var err error
		if cmd, err = launch.Command(ctx, procs, program, args); err != nil {
			return runSummary{}, err
		}
	}
	var summary runSummary
	if err := d.runForSummary(cmd, &summary); err != nil {
		return summary, err
	}
	switch {
	case !(summary.ExamplesPerSecond > 0):
		return summary, errors.New("its summary line reports no examples_per_second")
	case !(summary.TestAccuracy > 0):
		return summary, errors.New("its summary line reports no test_accuracy")
	case summary.Epochs != p.Epochs:
		return summary, fmt.Errorf("it trained %d epochs, the plan says %d", summary.Epochs, p.Epochs)
	}
	return summary, nil
}

// resNetRun is the ResNet's results of impl on procs processes, nil when it did not run.
func resNetRun(res *results, impl string, procs int) *endToEndResult {
	for i, r := range res.ResNet {
		if r.Impl == impl && r.Procs == procs && len(r.PerExample.Seconds) > 0 {
			return &res.ResNet[i]
		}
	}
	return nil
}

// resNetProcs are the process counts at which both goaccel's BLAS build and PyTorch ran.
func resNetProcs(res *results) []int {
	var out []int
	for _, n := range res.Plan.ResNet.Procs {
		if resNetRun(res, implGoaccel, n) != nil && resNetRun(res, implPyTorch, n) != nil {
			out = append(out, n)
		}
	}
	return out
}

// resNetGoals are the ResNet's goals: throughput and accuracy against PyTorch, judged on the BLAS build.
func resNetGoals(res *results) []*goal {
	throughput := &goal{what: "End to end: ResNet throughput",
		target: fmt.Sprintf("goaccel ≥ %.1f× PyTorch DDP's examples/s, 1 and 2 processes", goalResNetVsPyTorch)}
	accuracy := &goal{what: "End to end: ResNet accuracy", target: fmt.Sprintf("after the same epochs, goaccel's "+
		"test accuracy within %.2f of PyTorch's, medians over seeds", goalResNetAccuracyGap)}
	for _, n := range resNetProcs(res) {
		g, t := resNetRun(res, implGoaccel, n), resNetRun(res, implPyTorch, n)
		q := ratio(g.PerExample, t.PerExample)
		throughput.judgeRatio(q, goalResNetVsPyTorch, processes(n))
		a, b := quantile(g.TestAccuracy, 0.5), quantile(t.TestAccuracy, 0.5)
		// Rounded as shown, so that a gap the page prints as 0.0100 is met.
		accuracy.judge(math.Round(math.Abs(a-b)*1e4) <= goalResNetAccuracyGap*1e4, "%s: %.4f vs %.4f",
			processes(n), a, b)
	}
	return []*goal{throughput, accuracy}
}

func (r *reporter) resNet() {
	procs := resNetProcs(r.res)
	if len(procs) == 0 {
		return
	}
	p := r.res.Plan.ResNet
	r.section("### The ResNet", "the-resnet", "examples/resnet's job: a small ResNet on Fashion-MNIST (a 3×3 "+
		"convolution stem with batch normalization and max pooling, %d basic block(s) of %d channels, %d of %d "+
		"channels behind a strided block with a 1×1 projection shortcut, global average pooling, dropout %g, a "+
		"dense head), Adam (learning rate %g), %d examples per micro-batch per process, K = %d, epochs: %d, seed "+
		"%d + round: `bin/resnet` (goaccel, with OpenBLAS), `bin/resnet_purego` (the same program built "+
		"without the `blas` tag) and `internal/bench/pytorch/resnet_ddp.py` (PyTorch DDP over gloo; one process "+
		"trains without DDP). *Examples/s* is training examples × epochs / training time, without data loading, "+
		"compilation and evaluation; each of goaccel's processes computes with cores / processes threads, PyTorch "+
		"in its fastest configuration (below). Medians over the runs.", p.Blocks, p.Width, p.Blocks, 2*p.Width, p.Dropout, p.LR, p.Batch, p.K, p.Epochs, p.Seed)
	if p.Limit > 0 {
		r.p("> Trained on the first %d training examples only (-limit): accuracies are far from a full epoch's.\n\n", p.Limit)
	}
	var rows [][]string
	for _, n := range procs {
		g, t := resNetRun(r.res, implGoaccel, n), resNetRun(r.res, implPyTorch, n)
		pureRate, pureRatio, pureAccuracy := "—", "—", "—"
		if pure := resNetRun(r.res, implGoaccelPureGo, n); pure != nil {
			pureRate, pureRatio = rateCell(pure.PerExample), fmt.Sprintf("%.2f×", ratio(pure.PerExample, t.PerExample))
			pureAccuracy = fmt.Sprintf("%.4f", quantile(pure.TestAccuracy, 0.5))
		}
		rows = append(rows, []string{fmt.Sprint(n), rateCell(g.PerExample), pureRate, rateCell(t.PerExample),
			fmt.Sprintf("%.2f×", ratio(g.PerExample, t.PerExample)), pureRatio,
			fmt.Sprintf("%.4f", quantile(g.TestAccuracy, 0.5)), pureAccuracy, fmt.Sprintf("%.4f", quantile(t.TestAccuracy, 0.5)),
			fmt.Sprint(len(g.PerExample.Seconds))})
	}
	r.table([]string{">Processes", ">goaccel examples/s", ">goaccel pure Go examples/s", ">PyTorch examples/s",
		">goaccel / PyTorch", ">pure Go / PyTorch", ">goaccel test accuracy", ">pure Go test accuracy",
		">PyTorch test accuracy", ">Runs"}, rows)
	var notes []string
	if first, last := procs[0], procs[len(procs)-1]; first != last {
		rate := func(impl string, n int) float64 { return 1 / resNetRun(r.res, impl, n).PerExample.median() }
		notes = append(notes, fmt.Sprintf("From %d to %d processes goaccel's throughput changes %.2f×, PyTorch's %.2f×.",
			first, last, rate(implGoaccel, last)/rate(implGoaccel, first), rate(implPyTorch, last)/rate(implPyTorch, first)))
	}
	var accuracies []string
	for _, n := range procs {
		g, t := resNetRun(r.res, implGoaccel, n), resNetRun(r.res, implPyTorch, n)
		accuracies = append(accuracies, fmt.Sprintf("%s: goaccel %s, PyTorch %s", processes(n), accuracyList(g.TestAccuracy),
			accuracyList(t.TestAccuracy)))
	}
	notes = append(notes, fmt.Sprintf("Test accuracies by round (seed): %s.", strings.Join(accuracies, "; ")))
	switch g, t := resNetRun(r.res, implGoaccel, procs[0]).Parameters, resNetRun(r.res, implPyTorch, procs[0]).Parameters; {
	case g > 0 && g == t:
		notes = append(notes, fmt.Sprintf("Both models have %d parameters.", g))
	case g > 0 && t > 0:
		notes = append(notes, fmt.Sprintf("**The models differ:** goaccel's has %d parameters, PyTorch's %d.", g, t))
	}
	r.p("%s\n\n", strings.Join(notes, " "))
	var choices []labelledChoice
	for _, n := range procs {
		choices = append(choices, labelledChoice{processes(n), resNetRun(r.res, implPyTorch, n).PyTorch})
	}
	r.torchChoices("examples/s", fmt.Sprintf("%d training examples", examplesOf(p.calibrationJob(r.res.Plan.Calibration).Limit)),
		true, choices)
}

// accuracyList is "0.8812, 0.8790, 0.8845".
func accuracyList(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.4f", x)
	}
	return strings.Join(parts, ", ")
}
