package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/goaccel/goaccel/cpu"
)

// convEnv selects how the pure-Go backend computes convolutions: "graph" lowers them to im2col built from
// Slice and Concatenate (what the backend did first), "kernel" runs the dedicated convolution executor.
const convEnv = cpu.ConvEnvVar

// pureGoPlan is the demo's CNN trained by grad_accum built without the blas tag, once per variant, for the
// same examples: goaccel's release the goal was set against, built from its source, and this tree with each
// way of computing a convolution.
type pureGoPlan struct {
	Rounds                        int             // runs of each variant (0: skip the section)
	Variants                      []pureGoVariant // the baseline first
	Epochs, Batch, K, Limit, Seed int
	LR                            float64
}

// pureGoVariant is one program of the pure-Go CNN section.
type pureGoVariant struct {
	// Release, when set, is a goaccel release whose demo (built from that release's source, see the
	// -demo-purego-release flag) runs instead of this tree's.
	Release string
	// Conv is GOACCEL_CONV for this tree's demo: "graph" lowers convolutions to slices and dots, "kernel"
	// runs the convolution executor.
	Conv string
}

// name is the variant's benchstat key and table label.
func (v pureGoVariant) name() string {
	if v.Release != "" {
		return "release=" + v.Release
	}
	return "conv=" + v.Conv
}

// label is how the report names the variant.
func (v pureGoVariant) label() string {
	if v.Release != "" {
		return "goaccel " + v.Release + " (built from its source)"
	}
	return "`" + convEnv + "=" + v.Conv + "`"
}

// pureGoBaseline is the release the pure-Go goal was set against: the section builds its demo from the git
// commit the release was made from (Makefile, PUREGO_BASELINE).
const pureGoBaseline = "0.2.0"

// demoPlan times the command a new user runs first: `make demo DEMO_ARGS="-model cnn"`, as the demo binary
// with those arguments on one process, wall clock from start to exit.
type demoPlan struct {
	Runs int      // 0: skip the section
	Args []string // the demo's arguments
}

// pureGoResult is one variant's runs.
type pureGoResult struct {
	Variant pureGoVariant
	// PerExample is training seconds per training example, one sample per run: 1/median is examples/s.
	PerExample   series
	TestAccuracy []float64
}

// demoResult is the demo's wall time, one sample per run, and what its summary reported.
type demoResult struct {
	Args         []string
	Wall         series
	TrainSeconds []float64
	TestAccuracy []float64
}

// pureGoSummary is what the bench reads from the demo's summary line.
type pureGoSummary struct {
	TrainExamples     int     `json:"train_examples"`
	Epochs            int     `json:"epochs"`
	TrainSeconds      float64 `json:"train_seconds"`
	ExamplesPerSecond float64 `json:"examples_per_second"`
	TestAccuracy      float64 `json:"test_accuracy"`
}

// checkDemoPureGo fails early when a demo built without BLAS that the section runs is missing.
func checkDemoPureGo(p pureGoPlan, setup endToEndSetup) error {
	if _, err := os.Stat(setup.demoPureGo); err != nil {
		return fmt.Errorf("the purego section runs the demo built without BLAS: %w (build it with `go build -tags mpi "+
			"-o %s ./examples/grad_accum`, or leave purego out of -only)", err, setup.demoPureGo)
	}
	for _, v := range p.Variants {
		if v.Release == "" {
			continue
		}
		if _, err := os.Stat(setup.demoPureGoRelease); err != nil {
			return fmt.Errorf("the purego section runs goaccel %s's demo built without BLAS: %w (`make bench` builds it "+
				"from that release's commit; or leave purego out of -only)", v.Release, err)
		}
	}
	return nil
}

// demoArgs are the flags of the pure-Go CNN runs.
func (p pureGoPlan) demoArgs(dataDir string) []string {
	return []string{"-model", "cnn", "-epochs", strconv.Itoa(p.Epochs), "-batch", strconv.Itoa(p.Batch), "-k",
		strconv.Itoa(p.K), "-lr", fmt.Sprint(p.LR), "-seed", strconv.Itoa(p.Seed), "-limit", strconv.Itoa(p.Limit),
		"-data", dataDir, "-quiet"}
}

// measurePureGo runs the CNN once per variant and round, interleaved.
func (d *driver) measurePureGo(ctx context.Context) ([]pureGoResult, error) {
	p := d.plan.PureGoCNN
	if p.Rounds == 0 {
		return nil, nil
	}
	runs := make([]pureGoResult, len(p.Variants))
	for i, v := range p.Variants {
		runs[i] = pureGoResult{Variant: v, PerExample: series{Name: "PureGoCNN/" + v.name()}}
	}
	for round := range p.Rounds {
		for _, i := range rand.New(rand.NewPCG(uint64(round), 0xc0)).Perm(len(runs)) {
			r := &runs[i]
			d.progressf("pure-Go CNN: %s (round %d of %d)\n", r.Variant.name(), round+1, p.Rounds)
			ctx, cancel := context.WithTimeout(ctx, d.plan.JobTimeout)
			program := d.endToEnd.demoPureGo
			if r.Variant.Release != "" {
				program = d.endToEnd.demoPureGoRelease
			}
			cmd := exec.CommandContext(ctx, program, p.demoArgs(d.endToEnd.dataDir)...)
			cmd.Env = append(os.Environ(), convEnv+"="+r.Variant.Conv)
			var s pureGoSummary
			err := d.runForSummary(cmd, &s)
			cancel()
			if err == nil && !(s.ExamplesPerSecond > 0) {
				err = errors.New("its summary line reports no examples_per_second")
			}
			if err != nil {
				return nil, fmt.Errorf("pure-Go CNN, %s (%s=%s): %w", r.Variant.name(), convEnv, r.Variant.Conv, err)
			}
			r.PerExample.Iters = s.TrainExamples * s.Epochs
			r.PerExample.Seconds = append(r.PerExample.Seconds, 1/s.ExamplesPerSecond)
			r.TestAccuracy = append(r.TestAccuracy, s.TestAccuracy)
		}
	}
	for _, r := range runs {
		d.emit(r.PerExample)
	}
	return runs, nil
}

// measureDemo times the demo's command, the whole process, as its user waits for it.
func (d *driver) measureDemo(ctx context.Context) (*demoResult, error) {
	p := d.plan.Demo
	if p.Runs == 0 {
		return nil, nil
	}
	args := append(append([]string{}, p.Args...), "-data", d.endToEnd.dataDir, "-quiet")
	res := &demoResult{Args: p.Args, Wall: series{Name: "Demo/args=" + strings.ReplaceAll(strings.Join(p.Args, "_"), " ", "_"), Iters: 1}}
	for run := range p.Runs {
		d.progressf("demo: %s %s (run %d of %d)\n", d.endToEnd.demo, strings.Join(p.Args, " "), run+1, p.Runs)
		ctx, cancel := context.WithTimeout(ctx, d.plan.JobTimeout)
		cmd := exec.CommandContext(ctx, d.endToEnd.demo, args...)
		var s pureGoSummary
		start := time.Now()
		err := d.runForSummary(cmd, &s)
		wall := time.Since(start)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		res.Wall.Seconds = append(res.Wall.Seconds, wall.Seconds())
		res.TrainSeconds = append(res.TrainSeconds, s.TrainSeconds)
		res.TestAccuracy = append(res.TestAccuracy, s.TestAccuracy)
	}
	d.emit(res.Wall)
	return res, nil
}

// pureGoSpeedup is the last variant's examples/s over the first's (the baseline), and whether both ran.
func pureGoSpeedup(res *results) (float64, bool) {
	if len(res.PureGoCNN) < 2 {
		return 0, false
	}
	base, best := res.PureGoCNN[0], res.PureGoCNN[len(res.PureGoCNN)-1]
	if len(base.PerExample.Seconds) == 0 || len(best.PerExample.Seconds) == 0 {
		return 0, false
	}
	return ratio(best.PerExample, base.PerExample), true
}

func (r *reporter) pureGo() {
	if len(r.res.PureGoCNN) == 0 {
		return
	}
	p := r.res.Plan.PureGoCNN
	r.section("### The demo's CNN without BLAS", "the-demos-cnn-without-blas", "The demo built without the `blas` "+
		"tag, so every matrix product and convolution is pure Go: `bin/grad_accum_purego` from this tree, with each "+
		"way of computing a convolution (`%s`), and the same demo of goaccel %s, built from that release's source "+
		"(`bin/grad_accum_purego_%s`). The CNN, %d epoch(s) of the first %d training examples, batch %d, K = %d, "+
		"one process. *Examples/s* is over the training loop. Medians over the runs.", convEnv, pureGoBaseline,
		pureGoBaseline, p.Epochs, p.Limit, p.Batch, p.K)
	var rows [][]string
	base := r.res.PureGoCNN[0]
	for _, v := range r.res.PureGoCNN {
		if len(v.PerExample.Seconds) == 0 {
			continue
		}
		rows = append(rows, []string{v.Variant.label(), rateCell(v.PerExample),
			fmt.Sprintf("%.2f×", ratio(v.PerExample, base.PerExample)), fmt.Sprintf("%.4f", quantile(v.TestAccuracy, 0.5)),
			fmt.Sprint(len(v.PerExample.Seconds))})
	}
	r.table([]string{"Demo", ">Examples/s", ">Faster than " + base.Variant.label(), ">Test accuracy", ">Runs"}, rows)
}

func (r *reporter) demo() {
	d := r.res.Demo
	if d == nil || len(d.Wall.Seconds) == 0 {
		return
	}
	r.section("### The demo's wall time", "the-demos-wall-time", "`bin/grad_accum %s` on one process, timed from "+
		"start to exit as its user waits for it: loading the data, compiling, training and the test evaluation "+
		"(the compile of `go run` itself excluded).", strings.Join(d.Args, " "))
	r.table([]string{">Wall time", ">Training loop", ">Test accuracy", ">Runs"}, [][]string{{
		formatSeconds(d.Wall.median()), formatSeconds(quantile(d.TrainSeconds, 0.5)),
		fmt.Sprintf("%.4f", quantile(d.TestAccuracy, 0.5)), fmt.Sprint(len(d.Wall.Seconds))}})
}

// formatSeconds is "1 min 23 s" or "45.6 s".
func formatSeconds(sec float64) string {
	if sec < 60 {
		return fmt.Sprintf("%.1f s", sec)
	}
	return fmt.Sprintf("%d min %02d s", int(sec)/60, int(sec)%60)
}
