package bench

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// lstmPlan is examples/lstm's job, run by goaccel's program and by its PyTorch twin on one process: the
// same sine sequences (drawn from the seed), LSTM size, Adam learning rate, batch and epochs. The section
// reports the throughput and the final loss side by side, with no goal.
type lstmPlan struct {
	// Rounds are the runs of each variant (0: skip the section); round r trains from seed Seed + r, data
	// included, so that the final losses are medians over seeds.
	Rounds                          int
	Epochs, Batch, Examples, Length int
	Hidden                          int
	LR                              float64
	Seed                            int
}

// args are the job's flags in a program's syntax ("-" for Go, "--" for Python), training from seed.
func (p lstmPlan) args(dash string, seed int) []string {
	flags := []struct {
		name  string
		value any
	}{{"epochs", p.Epochs}, {"batch", p.Batch}, {"examples", p.Examples}, {"length", p.Length},
		{"hidden", p.Hidden}, {"lr", p.LR}, {"seed", seed}}
	var out []string
	for _, f := range flags {
		out = append(out, dash+f.name, fmt.Sprint(f.value))
	}
	return out
}

// lstmJob is examples/lstm's default job, as `make bench` runs it: three rounds of a few seconds each.
func lstmJob() lstmPlan {
	return lstmPlan{Rounds: 3, Epochs: 10, Batch: 32, Examples: 2048, Length: 16, Hidden: 32, LR: 0.01, Seed: 42}
}

//go:embed pytorch/lstm_sine.py
var lstmScript []byte

// lstmSetup is where the programs of the section are.
type lstmSetup struct {
	lstm   string // examples/lstm built with -tags mpi,blas
	script string // the PyTorch twin, written out by check
}

// check fails early, with what to do, when the program is missing, and writes the PyTorch twin into dir.
// PyTorch itself is checked with the demo's section (checkPyTorch).
func (s *lstmSetup) check(dir string) error {
	if _, err := os.Stat(s.lstm); err != nil {
		return fmt.Errorf("the lstm section runs examples/lstm: %w (build it with `go build -tags mpi,blas -o %s "+
			"./examples/lstm`, or leave lstm out of -only)", err, s.lstm)
	}
	s.script = filepath.Join(dir, "lstm_sine.py")
	return os.WriteFile(s.script, lstmScript, 0o644)
}

// lstmResult is one implementation's runs of the LSTM's job, one per round.
type lstmResult struct {
	Impl string // "goaccel" or "pytorch"
	// PerExample is training seconds per training sequence, one sample per run: 1/median is examples/s.
	PerExample series
	FinalLoss  []float64 // the last epoch's mean training loss, one per run
	Parameters int
	// PyTorch is how PyTorch's configuration was chosen (nil for goaccel).
	PyTorch *torchChoice `json:",omitempty"`
}

// lstmSummary is what the bench reads from the programs' JSON summary line.
type lstmSummary struct {
	TrainExamples     int      `json:"train_examples"`
	Epochs            int      `json:"epochs"`
	ExamplesPerSecond float64  `json:"examples_per_second"`
	FinalLoss         *float64 `json:"final_loss"` // null: the run diverged
	Parameters        int      `json:"parameters"`
}

// lstmCheck is when PyTorch computes the LSTM's job correctly without OPENBLAS_CORETYPE: the row has no
// goal, so its tolerance is this: the final mean squared error within 0.001, a fifth of a percent of what
// predicting 0 scores (0.5), far below what an LSTM that did not learn the sines scores (0.1 and more), and
// more than the whole spread between seeds (PyTorch's final losses at seeds 42–45: 0.00015–0.00044), which
// a run that differs from another only in rounding should stay within.
var lstmCheck = qualityCheck{Name: "final loss", Tolerance: 0.001, Format: "%.6f"}

// measureLSTM runs goaccel's program and the PyTorch twin once per round, in an order that changes from
// round to round, PyTorch in the configuration its calibration chose.
func (d *driver) measureLSTM(ctx context.Context) ([]lstmResult, error) {
	p := d.plan.LSTM
	if p.Rounds == 0 {
		return nil, nil
	}
	runs := []lstmResult{{Impl: implGoaccel, PerExample: series{Name: "LSTM/impl=goaccel"}},
		{Impl: implPyTorch, PerExample: series{Name: "LSTM/impl=pytorch"}}}
	job := p.calibrationJob(d.plan.Calibration)
	choice, err := d.choosePyTorch(ctx, "lstm: 1 process", 1, job.Examples*job.Epochs, lstmCheck,
		func(ctx context.Context, cfg torchConfig) (float64, float64, error) {
			s, err := d.runLSTM(ctx, job, implPyTorch, p.Seed, cfg)
			if err != nil {
				return 0, 0, err
			}
			return 1 / s.ExamplesPerSecond, *s.FinalLoss, nil
		})
	if err != nil {
		return nil, fmt.Errorf("lstm with pytorch: %w", err)
	}
	runs[1].PyTorch = choice
	for round := range p.Rounds {
		for _, i := range rand.New(rand.NewPCG(uint64(round), 0x157)).Perm(len(runs)) {
			r := &runs[i]
			d.progressf("lstm: %s (round %d of %d)\n", r.Impl, round+1, p.Rounds)
			s, err := d.runLSTM(ctx, p, r.Impl, p.Seed+round, d.torchConfigOf(r.PyTorch, 1))
			if err != nil {
				return nil, fmt.Errorf("lstm with %s: %w", r.Impl, err)
			}
			r.PerExample.Iters = s.TrainExamples * s.Epochs
			r.PerExample.Seconds = append(r.PerExample.Seconds, 1/s.ExamplesPerSecond)
			r.FinalLoss = append(r.FinalLoss, *s.FinalLoss)
			r.Parameters = s.Parameters
		}
	}
	for _, r := range runs {
		d.emit(r.PerExample)
	}
	return runs, nil
}

// calibrationJob is the LSTM's job of a calibration run: at most the calibration's examples.
func (p lstmPlan) calibrationJob(c calibrationPlan) lstmPlan {
	p.Examples = shorter(p.Examples, c.Examples)
	return p
}

// runLSTM trains the job p once from seed, PyTorch in configuration torch, and returns the summary the
// program ends its output with.
func (d *driver) runLSTM(ctx context.Context, p lstmPlan, impl string, seed int, torch torchConfig) (lstmSummary, error) {
	ctx, cancel := context.WithTimeout(ctx, d.plan.JobTimeout)
	defer cancel()
	var cmd *exec.Cmd
	if impl == implPyTorch {
		cmd = d.pytorchCommand(ctx, d.lstm.script, 1, torch, p.args("--", seed))
	} else {
		cmd = exec.CommandContext(ctx, d.lstm.lstm, append(p.args("-", seed), "-quiet")...)
	}
	var summary lstmSummary
	if err := d.runForSummary(cmd, &summary); err != nil {
		return summary, err
	}
	switch {
	case !(summary.ExamplesPerSecond > 0):
		return summary, errors.New("its summary line reports no examples_per_second")
	case summary.FinalLoss == nil:
		return summary, errors.New("its summary line reports no final_loss: training diverged")
	case summary.Epochs != p.Epochs:
		return summary, fmt.Errorf("it trained %d epochs, the plan says %d", summary.Epochs, p.Epochs)
	}
	return summary, nil
}

// lstmRun is the LSTM's results of impl, nil when it did not run.
func lstmRun(res *results, impl string) *lstmResult {
	for i, r := range res.LSTM {
		if r.Impl == impl && len(r.PerExample.Seconds) > 0 {
			return &res.LSTM[i]
		}
	}
	return nil
}

func (r *reporter) lstm() {
	g, t := lstmRun(r.res, implGoaccel), lstmRun(r.res, implPyTorch)
	if g == nil || t == nil {
		return
	}
	p := r.res.Plan.LSTM
	r.section("### The LSTM", "the-lstm", "examples/lstm's job, reported, no goal: an LSTM of %d units (GoMLX's "+
		"`layers/lstm`; `torch.nn.LSTM` in the twin) reads %d samples of a sine of random frequency and phase, and a "+
		"dense layer predicts the next sample; %d sequences drawn from seed %d + round, the same on both sides, %d per "+
		"batch, Adam (learning rate %g), mean squared error, %d epochs, one process: `bin/lstm` (goaccel) against "+
		"`internal/bench/pytorch/lstm_sine.py`. *Examples/s* is sequences × epochs / training time, without "+
		"generating the data and compiling; the final loss is the last epoch's mean training loss. goaccel computes "+
		"with the machine's cores, PyTorch in its fastest configuration (below). Medians over the runs.",
		p.Hidden, p.Length, p.Examples, p.Seed, p.Batch, p.LR, p.Epochs)
	r.table([]string{">Processes", ">goaccel examples/s", ">PyTorch examples/s", ">goaccel / PyTorch",
		">goaccel final loss", ">PyTorch final loss", ">Runs"},
		[][]string{{"1", rateCell(g.PerExample), rateCell(t.PerExample), fmt.Sprintf("%.2f×", ratio(g.PerExample, t.PerExample)),
			fmt.Sprintf("%.6f", quantile(g.FinalLoss, 0.5)), fmt.Sprintf("%.6f", quantile(t.FinalLoss, 0.5)),
			fmt.Sprint(len(g.PerExample.Seconds))}})
	var notes []string
	switch {
	case g.Parameters > 0 && g.Parameters == t.Parameters:
		notes = append(notes, fmt.Sprintf("Both models have %d parameters.", g.Parameters))
	case g.Parameters > 0 && t.Parameters > 0:
		notes = append(notes, fmt.Sprintf("**The models differ:** goaccel's has %d parameters, PyTorch's %d.", g.Parameters,
			t.Parameters))
	}
	notes = append(notes, fmt.Sprintf("Final losses by round (seed): goaccel %s, PyTorch %s.", lossList(g.FinalLoss),
		lossList(t.FinalLoss)))
	r.p("%s\n\n", strings.Join(notes, " "))
	r.torchChoices("examples/s", fmt.Sprintf("%d sequences, %d epochs", p.calibrationJob(r.res.Plan.Calibration).Examples,
		p.Epochs), false, []labelledChoice{{"1 process", t.PyTorch}})
}

// lossList is "0.000302, 0.000291".
func lossList(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.6f", x)
	}
	return strings.Join(parts, ", ")
}
