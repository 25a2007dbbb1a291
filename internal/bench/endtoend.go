package bench

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/goaccel/goaccel/internal/launch"
)

// endToEndPlan is the demo's job, run by goaccel's demo binary and by the PyTorch script: same model,
// Adam learning rate, per-process batch, K and epochs, with 1 and more processes.
type endToEndPlan struct {
	Models           []endToEndModel // none: skip the section
	Procs            []int
	Epochs, Batch, K int
	LR               float64
	Seed             int
	Limit            int // training examples (0: all 60000)
}

// endToEndModel is one of the demo's models ("mlp", "cnn") and how many times each variant trains it.
type endToEndModel struct {
	Name   string
	Rounds int
}

// endToEndSetup is where the programs of the section are.
type endToEndSetup struct {
	demo string // grad_accum built with -tags mpi
	// demoPureGo is grad_accum built without the blas tag: every product and convolution in pure Go;
	// demoPureGoRelease the same, built from the source of release pureGoBaseline.
	demoPureGo, demoPureGoRelease string
	python                        string // a Python 3 with torch
	dataDir                       string // Fashion-MNIST's IDX files
	script                        string // the PyTorch script, written out by check
}

//go:embed pytorch/fashion_ddp.py
var pytorchScript []byte

// checkPyTorch fails early, with what to install, when the Python with PyTorch is missing, and returns
// PyTorch's version.
func (s *endToEndSetup) checkPyTorch(ctx context.Context) (string, error) {
	version, err := exec.CommandContext(ctx, s.python, "-c", "import torch; print(torch.__version__)").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("the e2e and transformer sections need PyTorch for %s (apt-get install python3-torch, "+
			"or leave them out of -only): %v\n%s", s.python, err, version)
	}
	return string(bytes.TrimSpace(version)), nil
}

// writeScript writes the PyTorch script into dir.
func (s *endToEndSetup) writeScript(dir string) error {
	s.script = filepath.Join(dir, "fashion_ddp.py")
	return os.WriteFile(s.script, pytorchScript, 0o644)
}

// endToEndResult is one variant of the demo's job: an implementation, a model and a process count, one
// run per round.
type endToEndResult struct {
	Impl  string // "goaccel" or "pytorch"
	Model string
	Procs int
	// PerExample is training seconds per training example, one sample per run: 1/median is examples/s.
	PerExample   series
	TestAccuracy []float64
	Parameters   int // as the program reports them (0: not reported)
	// PyTorch is how a PyTorch row's configuration was chosen (nil: goaccel's rows, and results saved
	// before calibration, whose PyTorch ran cores / processes threads).
	PyTorch *torchChoice `json:",omitempty"`
}

func (r endToEndResult) examplesPerSecond() float64 { return 1 / r.PerExample.median() }

// runSummary is what the bench reads from the JSON line the demo and the PyTorch script end with.
type runSummary struct {
	TrainExamples     int     `json:"train_examples"`
	Epochs            int     `json:"epochs"`
	ExamplesPerSecond float64 `json:"examples_per_second"` // over the training loop only
	TestAccuracy      float64 `json:"test_accuracy"`
	Parameters        int     `json:"parameters"`
}

var endToEndImpls = []string{"goaccel", "pytorch"}

// measureEndToEnd runs, for each model, every implementation and process count once per round, in an
// order that changes from round to round, PyTorch in the configuration its calibration chose. Round r
// trains every variant from seed Seed + r: one epoch's test accuracy moves by a few hundredths from seed to
// seed (measured for the CNN on 2 processes, seeds 1–5: 0.842–0.864 with goaccel, 0.806–0.854 with
// PyTorch), so a single seed cannot compare the frameworks' accuracy to 0.01, and the median over seeds
// can. The throughput does not depend on the seed.
func (d *driver) measureEndToEnd(ctx context.Context) ([]endToEndResult, error) {
	p := d.plan.EndToEnd
	var out []endToEndResult
	for _, m := range p.Models {
		var runs []endToEndResult
		for _, impl := range endToEndImpls {
			for _, n := range p.Procs {
				runs = append(runs, endToEndResult{Impl: impl, Model: m.Name, Procs: n, PerExample: series{
					Name: fmt.Sprintf("EndToEnd/model=%s/impl=%s/procs=%d", m.Name, impl, n)}})
			}
		}
		for i := range runs {
			if r := &runs[i]; r.Impl == implPyTorch {
				var err error
				if r.PyTorch, err = d.calibrateEndToEnd(ctx, m.Name, r.Procs); err != nil {
					return nil, fmt.Errorf("%s with pytorch on %s: %w", m.Name, processes(r.Procs), err)
				}
			}
		}
		for round := range m.Rounds {
			for _, i := range rand.New(rand.NewPCG(uint64(round), 0xe2e)).Perm(len(runs)) {
				r := &runs[i]
				d.progressf("end to end: %s, %s, %s (round %d of %d)\n", r.Model, r.Impl, processes(r.Procs), round+1, m.Rounds)
				s, err := d.runEndToEnd(ctx, p, r.Impl, r.Model, r.Procs, p.Seed+round, d.torchConfigOf(r.PyTorch, r.Procs))
				if err != nil {
					return nil, fmt.Errorf("%s with %s on %s: %w", r.Model, r.Impl, processes(r.Procs), err)
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
		out = append(out, runs...)
	}
	return out, nil
}

// endToEndCheck is when PyTorch computes the demo's job correctly without OPENBLAS_CORETYPE: the CNN's
// accuracy goal's tolerance, for both models.
var endToEndCheck = qualityCheck{Name: "test accuracy", Tolerance: goalCNNAccuracyGap}

// calibrationJob is the demo's job of a calibration run: at most the calibration's examples.
func (p endToEndPlan) calibrationJob(c calibrationPlan) endToEndPlan {
	p.Limit = shorter(p.Limit, c.Examples)
	return p
}

// calibrateEndToEnd chooses PyTorch's configuration for the model on procs processes.
func (d *driver) calibrateEndToEnd(ctx context.Context, model string, procs int) (*torchChoice, error) {
	p := d.plan.EndToEnd
	job := p.calibrationJob(d.plan.Calibration)
	return d.choosePyTorch(ctx, fmt.Sprintf("end to end: %s, %s", model, processes(procs)), procs,
		examplesOf(job.Limit)*job.Epochs, endToEndCheck, func(ctx context.Context, cfg torchConfig) (float64, float64, error) {
			s, err := d.runEndToEnd(ctx, job, implPyTorch, model, procs, p.Seed, cfg)
			return 1 / s.ExamplesPerSecond, s.TestAccuracy, err
		})
}

// examplesOf is the training examples of a Fashion-MNIST job with -limit limit.
func examplesOf(limit int) int {
	if limit > 0 {
		return min(limit, 60000)
	}
	return 60000
}

// runEndToEnd trains the job p once from seed, PyTorch in configuration torch, and returns the summary line
// the program ends its output with.
func (d *driver) runEndToEnd(ctx context.Context, p endToEndPlan, impl, model string, procs, seed int,
	torch torchConfig) (runSummary, error) {
	s := d.endToEnd
	ctx, cancel := context.WithTimeout(ctx, d.plan.JobTimeout)
	defer cancel()
	// The same job on both sides, in each program's flag syntax.
	job := func(dash string) []string {
		return []string{dash + "model", model, dash + "epochs", strconv.Itoa(p.Epochs), dash + "batch",
			strconv.Itoa(p.Batch), dash + "k", strconv.Itoa(p.K), dash + "lr", fmt.Sprint(p.LR), dash + "seed",
			strconv.Itoa(seed), dash + "limit", strconv.Itoa(p.Limit), dash + "data", s.dataDir}
	}
	var stdout bytes.Buffer
	var cmd *exec.Cmd
	switch {
	case impl == implPyTorch:
		// PyTorch in its chosen configuration; goaccel sizes its threads from the local rank count, with
		// the environment as it is.
		cmd = d.pytorchCommand(ctx, s.script, procs, torch, job("--"))
	case procs == 1:
		cmd = exec.CommandContext(ctx, s.demo, append(job("-"), "-quiet")...)
	default:
		var err error
		if cmd, err = launch.Command(ctx, procs, s.demo, append(job("-"), "-quiet")); err != nil {
			return runSummary{}, err
		}
	}
	cmd.Stdout, cmd.Stderr = &stdout, d.progress
	if err := cmd.Run(); err != nil {
		return runSummary{}, fmt.Errorf("%s: %w", launch.String(cmd.Args), err)
	}
	out := strings.TrimSpace(stdout.String())
	var summary runSummary
	if err := json.Unmarshal([]byte(out[strings.LastIndexByte(out, '\n')+1:]), &summary); err != nil {
		return summary, fmt.Errorf("%s: the last line of its output is no JSON summary: %w\n%s", launch.String(cmd.Args), err, out)
	}
	if !(summary.ExamplesPerSecond > 0) {
		return summary, errors.New("its summary line reports no examples_per_second")
	}
	return summary, nil
}
