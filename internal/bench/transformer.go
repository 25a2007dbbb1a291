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
	"strings"

	"github.com/goaccel/goaccel/internal/launch"
)

// transformerPlan is examples/charlm's job, run by goaccel's binary and by its PyTorch twin: the same
// corpus, architecture, AdamW schedule, per-process batch, K and optimizer steps, with 1 and more processes.
type transformerPlan struct {
	Rounds int // runs of each variant (0: skip the section)
	Procs  []int
	// The job: flags of both programs.
	Context, DModel, Heads, Blocks int
	Batch, K, Steps, Warmup        int
	LR, WeightDecay, Clip          float64
	Seed                           int
	Limit                          int // training windows (0: all)
	EvalWindows                    int
}

// args are the job's flags in a program's syntax ("-" for Go, "--" for Python).
func (p transformerPlan) args(dash, corpus string) []string {
	flags := []struct {
		name  string
		value any
	}{{"context", p.Context}, {"dmodel", p.DModel}, {"heads", p.Heads}, {"blocks", p.Blocks}, {"batch", p.Batch},
		{"k", p.K}, {"steps", p.Steps}, {"warmup", p.Warmup}, {"lr", p.LR}, {"wd", p.WeightDecay}, {"clip", p.Clip},
		{"seed", p.Seed}, {"limit", p.Limit},
		{"eval-windows", p.EvalWindows}, {"data", corpus}}
	var out []string
	for _, f := range flags {
		out = append(out, dash+f.name, fmt.Sprint(f.value))
	}
	return out
}

//go:embed pytorch/charlm_ddp.py
var charlmScript []byte

// transformerSetup is where the programs and the corpus of the section are.
type transformerSetup struct {
	charlm string // examples/charlm built with -tags mpi
	corpus string // the root of the .go files (Go's own source)
	script string // the PyTorch twin, written out by check
}

// defaultCorpus is Go's standard-library source, $GOROOT/src of the go command on the PATH, as charlm's
// own default; empty when there is no go command (check then asks for -corpus).
func defaultCorpus() string {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		return ""
	}
	return filepath.Join(string(bytes.TrimSpace(out)), "src")
}

// check fails early, with what to do, when a program or the corpus is missing. PyTorch itself is checked
// with the demo's section (checkPyTorch).
func (s *transformerSetup) check(dir string) error {
	if _, err := os.Stat(s.charlm); err != nil {
		return fmt.Errorf("the transformer section runs examples/charlm: %w (build it with `go build -tags mpi,blas "+
			"-o %s ./examples/charlm`, or leave transformer out of -only)", err, s.charlm)
	}
	if info, err := os.Stat(s.corpus); err != nil || !info.IsDir() {
		return fmt.Errorf("the transformer section trains on the .go files under -corpus %q, which is not a "+
			"directory (%v)", s.corpus, err)
	}
	s.script = filepath.Join(dir, "charlm_ddp.py")
	return os.WriteFile(s.script, charlmScript, 0o644)
}

// transformerResult is one variant of the job: an implementation and a process count, one run per round.
type transformerResult struct {
	Impl  string // "goaccel" or "pytorch"
	Procs int
	// PerToken is training seconds per predicted byte, one sample per run: 1/median is tokens/s.
	PerToken       series
	ValidationLoss []float64 // nats per byte, one per run
	Steps          int64
	Parameters     int
	// PyTorch is how a PyTorch row's configuration was chosen (nil: goaccel's rows, and results saved
	// before calibration).
	PyTorch *torchChoice `json:",omitempty"`
}

func (r transformerResult) tokensPerSecond() float64 { return 1 / r.PerToken.median() }

// transformerSummary is what the bench reads from the programs' JSON summary line.
type transformerSummary struct {
	Steps           int64    `json:"steps"`
	TrainTokens     int64    `json:"train_tokens"`
	TokensPerSecond float64  `json:"tokens_per_second"`
	ValidationLoss  *float64 `json:"validation_loss"` // null: the run diverged
	Parameters      int      `json:"parameters"`
}

// measureTransformer runs every implementation and process count once per round, in an order that
// changes from round to round, PyTorch in the configuration its calibration chose.
func (d *driver) measureTransformer(ctx context.Context) ([]transformerResult, error) {
	p := d.plan.Transformer
	if p.Rounds == 0 {
		return nil, nil
	}
	var runs []transformerResult
	for _, impl := range endToEndImpls {
		for _, n := range p.Procs {
			runs = append(runs, transformerResult{Impl: impl, Procs: n,
				PerToken: series{Name: fmt.Sprintf("Transformer/impl=%s/procs=%d", impl, n)}})
		}
	}
	for i := range runs {
		if r := &runs[i]; r.Impl == implPyTorch {
			var err error
			if r.PyTorch, err = d.calibrateTransformer(ctx, r.Procs); err != nil {
				return nil, fmt.Errorf("transformer with pytorch on %s: %w", processes(r.Procs), err)
			}
		}
	}
	for round := range p.Rounds {
		for _, i := range rand.New(rand.NewPCG(uint64(round), 0x7f)).Perm(len(runs)) {
			r := &runs[i]
			d.progressf("transformer: %s, %s (round %d of %d)\n", r.Impl, processes(r.Procs), round+1, p.Rounds)
			s, err := d.runTransformer(ctx, p, r.Impl, r.Procs, d.torchConfigOf(r.PyTorch, r.Procs))
			if err != nil {
				return nil, fmt.Errorf("transformer with %s on %s: %w", r.Impl, processes(r.Procs), err)
			}
			r.PerToken.Iters = int(s.TrainTokens)
			r.PerToken.Seconds = append(r.PerToken.Seconds, 1/s.TokensPerSecond)
			r.ValidationLoss = append(r.ValidationLoss, *s.ValidationLoss)
			r.Steps, r.Parameters = s.Steps, s.Parameters
		}
	}
	for _, r := range runs {
		d.emit(r.PerToken)
	}
	return runs, nil
}

// transformerCheck is when PyTorch computes the transformer's job correctly without OPENBLAS_CORETYPE:
// the loss goal's tolerance.
var transformerCheck = qualityCheck{Name: "validation loss", Tolerance: goalTransformerLossGap, Relative: true}

// calibrationJob is the transformer's job of a calibration run: at most the calibration's optimizer steps.
func (p transformerPlan) calibrationJob(c calibrationPlan) transformerPlan {
	p.Steps = shorter(p.Steps, c.Steps)
	p.Warmup = min(p.Warmup, p.Steps)
	return p
}

// calibrateTransformer chooses PyTorch's configuration for the transformer on procs processes.
func (d *driver) calibrateTransformer(ctx context.Context, procs int) (*torchChoice, error) {
	job := d.plan.Transformer.calibrationJob(d.plan.Calibration)
	tokens := job.Steps * job.K * job.Batch * job.Context * procs
	return d.choosePyTorch(ctx, "transformer: "+processes(procs), procs, tokens, transformerCheck,
		func(ctx context.Context, cfg torchConfig) (float64, float64, error) {
			s, err := d.runTransformer(ctx, job, implPyTorch, procs, cfg)
			if err != nil {
				return 0, 0, err
			}
			return 1 / s.TokensPerSecond, *s.ValidationLoss, nil
		})
}

// calibrationSteps says what a transformer calibration run trains, for the page.
func calibrationSteps(p plan) string {
	return fmt.Sprintf("%d optimizer steps", p.Transformer.calibrationJob(p.Calibration).Steps)
}

// runTransformer trains the job p once, PyTorch in configuration torch, and returns the summary the
// program ends its output with.
func (d *driver) runTransformer(ctx context.Context, p transformerPlan, impl string, procs int,
	torch torchConfig) (transformerSummary, error) {
	s := d.transformer
	ctx, cancel := context.WithTimeout(ctx, d.plan.JobTimeout)
	defer cancel()
	var cmd *exec.Cmd
	switch {
	case impl == implPyTorch:
		cmd = d.pytorchCommand(ctx, s.script, procs, torch, p.args("--", s.corpus))
	case procs == 1:
		cmd = exec.CommandContext(ctx, s.charlm, append(p.args("-", s.corpus), "-quiet")...)
	default:
		var err error
		if cmd, err = launch.Command(ctx, procs, s.charlm, append(p.args("-", s.corpus), "-quiet")); err != nil {
			return transformerSummary{}, err
		}
	}
	var summary transformerSummary
	if err := d.runForSummary(cmd, &summary); err != nil {
		return summary, err
	}
	switch {
	case !(summary.TokensPerSecond > 0):
		return summary, errors.New("its summary line reports no tokens_per_second")
	case summary.ValidationLoss == nil:
		return summary, errors.New("its summary line reports no validation_loss: training diverged")
	case summary.Steps != int64(p.Steps):
		return summary, fmt.Errorf("it took %d optimizer steps, the plan says %d", summary.Steps, p.Steps)
	}
	return summary, nil
}

// runForSummary runs cmd, its output to the progress writer but for standard output's last line, which must
// be a JSON object: it is decoded into v.
func (d *driver) runForSummary(cmd *exec.Cmd, v any) error {
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, d.progress
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w\n%s", launch.String(cmd.Args), err, lastLines(stdout.String(), 5))
	}
	out := strings.TrimSpace(stdout.String())
	if err := json.Unmarshal([]byte(out[strings.LastIndexByte(out, '\n')+1:]), v); err != nil {
		return fmt.Errorf("%s: the last line of its output is no JSON summary: %w\n%s", launch.String(cmd.Args), err,
			lastLines(out, 5))
	}
	return nil
}

// lastLines is the end of a program's output, for error messages.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// transformerPairs are the results as (goaccel, PyTorch) pairs, by process count.
func transformerPairs(res *results) [][2]transformerResult {
	var out [][2]transformerResult
	for _, g := range res.Transformer {
		for _, t := range res.Transformer {
			if g.Impl == "goaccel" && t.Impl == "pytorch" && g.Procs == t.Procs && len(g.PerToken.Seconds) > 0 &&
				len(t.PerToken.Seconds) > 0 {
				out = append(out, [2]transformerResult{g, t})
			}
		}
	}
	return out
}

// lossGap is goaccel's median validation loss over PyTorch's, minus one: +0.01 is 1% higher.
func lossGap(pair [2]transformerResult) float64 {
	return quantile(pair[0].ValidationLoss, 0.5)/quantile(pair[1].ValidationLoss, 0.5) - 1
}

func (r *reporter) transformer() {
	pairs := transformerPairs(r.res)
	if len(pairs) == 0 {
		return
	}
	p := r.res.Plan.Transformer
	r.section("### The transformer language model", "the-transformer-language-model", "examples/charlm's job: a "+
		"byte-level decoder-only transformer (%d blocks, d_model %d, %d heads, context %d) learns to predict the next "+
		"byte of Go's standard-library source; AdamW (peak learning rate %g, weight decay %g, %d warm-up steps, cosine "+
		"decay), gradient norm clipped to %g, %d windows per micro-batch per process, K = %d, %d optimizer steps, seed %d: `bin/charlm` "+
		"(goaccel) against `internal/bench/pytorch/charlm_ddp.py` (PyTorch DDP over gloo; one process trains without DDP). "+
		"*Tokens/s* is predicted bytes of every process / training time, without loading the corpus and the "+
		"validation; the validation loss is the mean cross-entropy in nats per byte over %d held-out windows. "+
		"Each of goaccel's processes computes with cores / processes threads, PyTorch in its fastest configuration "+
		"(below). Medians over the runs.", p.Blocks, p.DModel, p.Heads, p.Context, p.LR, p.WeightDecay, p.Warmup, p.Clip, p.Batch, p.K, p.Steps,
		p.Seed, p.EvalWindows)
	var rows [][]string
	for _, pair := range pairs {
		g, t := pair[0], pair[1]
		rows = append(rows, []string{fmt.Sprint(g.Procs), rateCell(g.PerToken), rateCell(t.PerToken),
			fmt.Sprintf("%.2f×", g.tokensPerSecond()/t.tokensPerSecond()),
			fmt.Sprintf("%.4f", quantile(g.ValidationLoss, 0.5)), fmt.Sprintf("%.4f", quantile(t.ValidationLoss, 0.5)),
			signedPercent(lossGap(pair)), fmt.Sprint(len(g.PerToken.Seconds))})
	}
	r.table([]string{">Processes", ">goaccel tokens/s", ">PyTorch tokens/s", ">goaccel / PyTorch",
		">goaccel validation loss", ">PyTorch validation loss", ">Loss difference", ">Runs"}, rows)
	switch g, t := pairs[0][0].Parameters, pairs[0][1].Parameters; {
	case g > 0 && g == t:
		r.p("Both models have %d parameters.\n\n", g)
	case g > 0 && t > 0:
		r.p("**The models differ:** goaccel's has %d parameters, PyTorch's %d.\n\n", g, t)
	}
	var choices []labelledChoice
	for _, pair := range pairs {
		choices = append(choices, labelledChoice{processes(pair[1].Procs), pair[1].PyTorch})
	}
	r.torchChoices("tokens/s", calibrationSteps(r.res.Plan), true, choices)
}

// signedPercent is "+1.2%" or "−0.4%".
func signedPercent(f float64) string {
	return strings.Replace(fmt.Sprintf("%+.1f%%", 100*f), "-", "−", 1)
}
