package accel_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers/regularizers"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers/cosineschedule"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// The conformance tests train a two-weight linear model, y ≈ x·w from w = (0, 0) with a mean squared error
// and SGD (learning rate 0.1, no decay), whose every gradient is computed by hand below: each run's
// weights, gradients and learning rates are compared with plain float64 arithmetic on the examples each
// optimizer step covers. The loaders do not shuffle, so optimizer step s of N ranks × K micro-batches × b
// covers examples [s·N·K·b, (s+1)·N·K·b) of the epoch, and a short final cycle of m micro-batches covers
// the next m·N·b.

const (
	confBatch = 2   // per rank
	confLR    = 0.1 // SGD
	confTol   = 1e-9
	linWeight = "/linear/w"
)

// linExample is example i: x = (1 + i mod 3, (i mod 5)/2 - 1), y = (i mod 7)/3 - 1.
func linExample(i int) (x [2]float64, y float64) {
	return [2]float64{1 + float64(i%3), float64(i%5)/2 - 1}, float64(i%7)/3 - 1
}

// linGrad is the gradient of mean_i (x_i·w - y_i)² + l2·|w|² over examples [from, to) at w.
func linGrad(w [2]float64, from, to int, l2 float64) [2]float64 {
	var g [2]float64
	for i := from; i < to; i++ {
		x, y := linExample(i)
		r := x[0]*w[0] + x[1]*w[1] - y
		g[0] += 2 * r * x[0]
		g[1] += 2 * r * x[1]
	}
	n := float64(to - from)
	return [2]float64{g[0]/n + 2*l2*w[0], g[1]/n + 2*l2*w[1]}
}

// linGradOf is linGrad over a list of example indices.
func linGradOf(w [2]float64, indices []int) [2]float64 {
	var g [2]float64
	for _, i := range indices {
		x, y := linExample(i)
		r := x[0]*w[0] + x[1]*w[1] - y
		g[0] += 2 * r * x[0]
		g[1] += 2 * r * x[1]
	}
	n := float64(len(indices))
	return [2]float64{g[0] / n, g[1] / n}
}

// linSGD applies one SGD step per chunk [from, to) with the given learning rates.
func linSGD(chunks [][2]int, lrs []float64, l2 float64) [2]float64 {
	var w [2]float64
	for s, c := range chunks {
		g := linGrad(w, c[0], c[1], l2)
		w[0] -= lrs[s] * g[0]
		w[1] -= lrs[s] * g[1]
	}
	return w
}

// linChunks are the optimizer steps' example ranges of epochs epochs of batches micro-batches per rank,
// K micro-batches per step, n ranks.
func linChunks(n, k, batches, epochs int) [][2]int {
	var chunks [][2]int
	for e := range epochs {
		base := e * n * confBatch * batches
		for from := 0; from < batches; from += k {
			to := min(from+k, batches)
			chunks = append(chunks, [2]int{base + from*n*confBatch, base + to*n*confBatch})
		}
	}
	return chunks
}

func constantLRs(steps int) []float64 {
	lrs := make([]float64, steps)
	for i := range lrs {
		lrs[i] = confLR
	}
	return lrs
}

// Cosine schedule of the conformance runs: warm-up over 2 steps from the minimum, then a cosine of period 4.
const (
	cosLR, cosMinLR      = 0.1, 0.01
	cosWarmUp, cosPeriod = 2, 4
)

// cosineRate is cosineschedule's rate for optimizer step s (from 0), computed by hand.
func cosineRate(s int) float64 {
	if s < cosWarmUp {
		return cosMinLR + float64(s)/cosWarmUp*(cosLR-cosMinLR)
	}
	cycle := float64(s-cosWarmUp) / cosPeriod
	cycle -= math.Floor(cycle)
	return cosMinLR + (cosLR-cosMinLR)*(1+math.Cos(math.Pi*cycle))/2
}

// halvingRate is the Go-side schedule of the conformance runs.
func halvingRate(step int64) float64 { return confLR * math.Pow(0.5, float64(step)) }

// linearModel is y = x·w with w a [2, 1] float64 variable starting at 0; l2 adds regularizers.L2 on w
// and cosine a cosineschedule in the model function, as a GoMLX user writes them.
func linearModel(l2 float64, cosine bool) prepare.ModelFn {
	return func(ctx *context.Context, in []*Node) []*Node {
		g := in[0].Graph()
		w := ctx.In("linear").VariableWithValue("w", [][]float64{{0}, {0}})
		if l2 > 0 {
			regularizers.L2(l2)(ctx, g, w)
		}
		if cosine {
			cosineschedule.New(ctx, g, dtypes.Float64).LearningRate(cosLR).MinLearningRate(cosMinLR).
				WarmUpSteps(cosWarmUp).PeriodSteps(cosPeriod).Done()
		}
		return []*Node{MatMul(in[0], w.ValueGraph(g))}
	}
}

// linSource holds examples [0, n); examples in nanFrom ≤ i < nanTo have a NaN input.
func linSource(n, nanFrom, nanTo int) (prepare.Source, error) {
	xs, ys := make([]float64, 0, 2*n), make([]float64, 0, n)
	for i := range n {
		x, y := linExample(i)
		if i >= nanFrom && i < nanTo {
			x[0] = math.NaN()
		}
		xs, ys = append(xs, x[0], x[1]), append(ys, y)
	}
	return prepare.TensorSource([]*tensors.Tensor{tensors.FromFlatDataAndDimensions(xs, n, 2)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(ys, n, 1)})
}

// linRun is one training run of the linear model.
type linRun struct {
	k                int
	syncEachBatch    bool
	batches, epochs  int // per rank and epoch
	l2               float64
	cosine           bool
	schedule         prepare.Schedule
	nanStep          int // when > 0, the examples of this 1-based optimizer step are NaN and it is skipped
	nestedEvaluation bool
	// inside runs in each Accumulate call after Backward, before Step.
	inside func(acc *accel.Accelerator, model *prepare.Model, loader *prepare.DataLoader, microBatch int) error
}

// linResult is what a run reports to the parent test.
type linResult struct {
	W                     []float64 `json:"w"`
	Steps                 int64     `json:"steps"`
	Skipped               int64     `json:"skipped"`
	Reductions            int64     `json:"reductions"` // all-reduce rounds (Stats.Syncs)
	Syncs                 []bool    `json:"syncs"`      // SyncGradients per micro-batch
	StepInCycleAfterEpoch []int     `json:"step_in_cycle_after_epoch"`
	// LRs and Counters are the learning-rate variable and the cosine schedule's counter after each step.
	LRs      []float64 `json:"lrs"`
	Counters []int64   `json:"counters"`
	NextLR   float64   `json:"next_lr"` // the Go scheduler's rate for the next step
}

func (r linRun) train(acc *accel.Accelerator) (linResult, error) {
	var res linResult
	n := acc.WorldSize() * confBatch * r.batches
	nanFrom, nanTo := 0, 0
	if r.nanStep > 0 {
		chunk := linChunks(acc.WorldSize(), r.k, r.batches, 1)[r.nanStep-1]
		nanFrom, nanTo = chunk[0], chunk[1]
	}
	src, err := linSource(n, nanFrom, nanTo)
	if err != nil {
		return res, err
	}
	ctx := context.New()
	model, err := acc.PrepareModel(ctx, linearModel(r.l2, r.cosine), losses.MeanSquaredError)
	if err != nil {
		return res, err
	}
	opt, err := acc.PrepareOptimizer(model, optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(confLR),
		prepare.OnNonFinite(prepare.NonFiniteSkip))
	if err != nil {
		return res, err
	}
	var sched *prepare.Scheduler
	if r.schedule != nil {
		if sched, err = acc.PrepareScheduler(opt, r.schedule); err != nil {
			return res, err
		}
	}
	loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(confBatch))
	if err != nil {
		return res, err
	}
	first, err := loader.PeekBatch()
	if err != nil {
		return res, err
	}
	if err := model.Materialize(first); err != nil {
		return res, err
	}
	var eval *prepare.DataLoader
	if r.nestedEvaluation {
		if eval, err = acc.PrepareDataLoader(src, prepare.BatchSize(confBatch)); err != nil {
			return res, err
		}
	}
	recordStep := func() error {
		lr, err := scalarVariable(ctx, "/"+optimizers.Scope, optimizers.ParamLearningRate)
		if err != nil {
			return err
		}
		res.LRs = append(res.LRs, lr)
		if r.cosine {
			counter, err := scalarVariable(ctx, "/"+optimizers.Scope+"/"+cosineschedule.Scope, optimizers.GlobalStepVariableName)
			if err != nil {
				return err
			}
			res.Counters = append(res.Counters, int64(counter))
		}
		return nil
	}
	micro := 0
	for epoch := range r.epochs {
		loader.SetEpoch(epoch)
		for batch, err := range loader.All() {
			if err != nil {
				return res, err
			}
			if eval != nil {
				// An evaluation loop in the middle of the training loop, as users write them.
				for b, err := range eval.All() {
					if err != nil {
						return res, err
					}
					if _, err := model.Predict(b.Inputs...); err != nil {
						return res, err
					}
				}
			}
			err = acc.Accumulate(func() error {
				if _, err := acc.Backward(model, batch); err != nil {
					return err
				}
				res.Syncs = append(res.Syncs, acc.SyncGradients())
				if r.inside != nil {
					if err := r.inside(acc, model, loader, micro); err != nil {
						return err
					}
				}
				stepped, err := opt.Step()
				if err != nil {
					return err
				}
				if stepped {
					if err := recordStep(); err != nil {
						return err
					}
				}
				return opt.ZeroGrad()
			})
			if err != nil {
				return res, fmt.Errorf("epoch %d micro-batch %d: %w", epoch, micro, err)
			}
			micro++
		}
		res.StepInCycleAfterEpoch = append(res.StepInCycleAfterEpoch, acc.GradientState().StepInCycle())
	}
	w, err := flatVariable(ctx, "/linear", "w")
	if err != nil {
		return res, err
	}
	res.W, res.Steps, res.Skipped, res.Reductions = w, opt.Steps(), opt.SkippedSteps(), acc.Stats().Syncs
	if sched != nil {
		res.NextLR = sched.LearningRate()
	}
	return res, nil
}

func flatVariable(ctx *context.Context, scope, name string) ([]float64, error) {
	v := ctx.GetVariableByScopeAndName(scope, name)
	if v == nil {
		return nil, fmt.Errorf("no variable %s/%s", scope, name)
	}
	return testmodel.FlatFloat64(v)
}

func scalarVariable(ctx *context.Context, scope, name string) (float64, error) {
	flat, err := flatVariable(ctx, scope, name)
	if err != nil {
		return 0, err
	}
	if len(flat) != 1 {
		return 0, fmt.Errorf("variable %s/%s has %d values, want a scalar", scope, name, len(flat))
	}
	return flat[0], nil
}

// gradientsView is what the gradient-view run saw at each micro-batch.
type gradientsView struct {
	Grads [][]float64          `json:"grads"` // Gradients() of the weight at each check
	Norm  float64              `json:"norm"`  // what ClipGradNorm returned
	State []accelGradientState `json:"state"` // at each micro-batch
	Outer accelGradientState   `json:"outer"` // outside any loop
	Tail  accelGradientState   `json:"tail"`  // in a loader whose last round is incomplete
	Run   linResult            `json:"run"`
}

// accelGradientState is the accelerator's gradient state without the loader pointer, for JSON.
type accelGradientState struct {
	SyncGradients, EndOfDataloader, Active bool
	Remainder, StepInCycle                 int
}

func gradientStateOf(acc *accel.Accelerator, loader *prepare.DataLoader) accelGradientState {
	gs := acc.GradientState()
	active := acc.ActiveDataLoader()
	return accelGradientState{SyncGradients: gs.SyncGradients(), EndOfDataloader: gs.EndOfDataloader(),
		Active: active != nil && active == loader, Remainder: gs.Remainder(), StepInCycle: gs.StepInCycle()}
}

func weightGradient(model *prepare.Model) ([]float64, error) {
	grads, err := model.Gradients()
	if err != nil {
		return nil, err
	}
	g, ok := grads[linWeight]
	if !ok {
		return nil, fmt.Errorf("no gradient for %s among %d", linWeight, len(grads))
	}
	return tensors.MustCopyFlatData[float64](g), nil
}

// Clipping of the gradient-view run: the first step's norm is clipped to half of itself, the second
// step's values to ±clipValue.
const clipValue = 0.05

// conformanceReport is one rank's report of every conformance run.
type conformanceReport struct {
	Rank          int                  `json:"rank"`
	SyncEachBatch map[string]linResult `json:"sync_each_batch"`
	Nested        linResult            `json:"nested"`
	Regularized   linResult            `json:"regularized"`
	Cosine        map[int]linResult    `json:"cosine"` // by K
	Scheduler     map[int]linResult    `json:"scheduler"`
	Skipped       linResult            `json:"skipped"`
	Gradients     gradientsView        `json:"gradients"`
	Uneven        unevenView           `json:"uneven"`
}

// unevenView is what the uneven-gather check saw: rank r passes r+1 rows [r·10 + i, -(r·10 + i)].
type unevenView struct {
	PaddedRows int       `json:"padded_rows"`
	Padded     []float32 `json:"padded"`
	Rows       []int     `json:"rows"`
	Gathered   []float32 `json:"gathered"`
	Dims       []int     `json:"dims"`
}

func unevenRows(rank int) []float32 {
	var rows []float32
	for i := range rank + 1 {
		v := float32(rank*10 + i)
		rows = append(rows, v, -v)
	}
	return rows
}

func unevenRun(newAcc func(opts ...accel.Option) (*accel.Accelerator, error)) (unevenView, error) {
	var view unevenView
	acc, err := newAcc()
	if err != nil {
		return view, err
	}
	defer acc.Close()
	t := tensors.FromFlatDataAndDimensions(unevenRows(acc.Rank()), acc.Rank()+1, 2)
	padded, rows, err := acc.PadAcrossProcesses(t, -1)
	if err != nil {
		return view, err
	}
	view.PaddedRows, view.Padded, view.Rows = padded.Shape().Dimensions[0], tensors.MustCopyFlatData[float32](padded), rows
	all, err := acc.GatherUneven(t)
	if err != nil {
		return view, err
	}
	view.Gathered, view.Dims = tensors.MustCopyFlatData[float32](all), all.Shape().Dimensions
	return view, nil
}

var confKs = []int{1, 2, 4}

// conformance runs every conformance check on this rank; newAcc makes an accelerator of the job.
func conformance(newAcc func(opts ...accel.Option) (*accel.Accelerator, error)) (rep conformanceReport, err error) {
	run := func(r linRun, opts ...accel.Option) (linResult, error) {
		acc, err := newAcc(append([]accel.Option{accel.WithGradientAccumulationSteps(r.k)}, opts...)...)
		if err != nil {
			return linResult{}, err
		}
		rep.Rank = acc.Rank()
		res, err := r.train(acc)
		if cerr := acc.Close(); err == nil {
			err = cerr
		}
		return res, err
	}
	rep.SyncEachBatch = map[string]linResult{}
	for _, k := range []int{2, 4} {
		for _, each := range []bool{false, true} {
			r := linRun{k: k, syncEachBatch: each, batches: 2*k + 1, epochs: 1}
			var opts []accel.Option
			if each {
				opts = append(opts, accel.WithSyncEachBatch())
			}
			if rep.SyncEachBatch[fmt.Sprintf("K=%d/each=%t", k, each)], err = run(r, opts...); err != nil {
				return rep, fmt.Errorf("sync each batch K=%d: %w", k, err)
			}
		}
	}
	if rep.Nested, err = run(linRun{k: 2, batches: 3, epochs: 2, nestedEvaluation: true}); err != nil {
		return rep, fmt.Errorf("nested loaders: %w", err)
	}
	if rep.Regularized, err = run(linRun{k: 2, batches: 4, epochs: 1, l2: 0.5}); err != nil {
		return rep, fmt.Errorf("regularizer: %w", err)
	}
	rep.Cosine, rep.Scheduler = map[int]linResult{}, map[int]linResult{}
	for _, k := range confKs {
		if rep.Cosine[k], err = run(linRun{k: k, batches: 6 * k, epochs: 1, cosine: true}); err != nil {
			return rep, fmt.Errorf("cosine schedule K=%d: %w", k, err)
		}
		if rep.Scheduler[k], err = run(linRun{k: k, batches: 3 * k, epochs: 1, schedule: halvingRate}); err != nil {
			return rep, fmt.Errorf("scheduler K=%d: %w", k, err)
		}
	}
	if rep.Skipped, err = run(linRun{k: 2, batches: 6, epochs: 1, cosine: true, nanStep: 2}); err != nil {
		return rep, fmt.Errorf("skipped step: %w", err)
	}
	if rep.Gradients, err = gradientsRun(newAcc); err != nil {
		return rep, err
	}
	rep.Uneven, err = unevenRun(newAcc)
	return rep, err
}

// gradientsRun trains K=2 over 3 micro-batches, reading the gradients and the gradient state at each one,
// clipping the first step by norm and the second (short) one by value.
func gradientsRun(newAcc func(opts ...accel.Option) (*accel.Accelerator, error)) (gradientsView, error) {
	var view gradientsView
	acc, err := newAcc(accel.WithGradientAccumulationSteps(2))
	if err != nil {
		return view, err
	}
	defer acc.Close()
	view.Outer = gradientStateOf(acc, nil)
	r := linRun{k: 2, batches: 3, epochs: 1,
		inside: func(acc *accel.Accelerator, model *prepare.Model, loader *prepare.DataLoader, micro int) error {
			view.State = append(view.State, gradientStateOf(acc, loader))
			g, err := weightGradient(model)
			if err != nil {
				return err
			}
			view.Grads = append(view.Grads, g)
			switch micro {
			case 1:
				norm := math.Hypot(g[0], g[1])
				if view.Norm, err = acc.ClipGradNorm(model, norm/2); err != nil {
					return err
				}
			case 2:
				if err := acc.ClipGradValue(model, clipValue); err != nil {
					return err
				}
			default:
				// Not a sync: clipping does nothing.
				norm, err := acc.ClipGradNorm(model, 1e-9)
				if err != nil || norm != 0 {
					return fmt.Errorf("ClipGradNorm on a micro-batch that does not sync returned %g, %v", norm, err)
				}
			}
			if micro > 0 {
				g, err := weightGradient(model)
				if err != nil {
					return err
				}
				view.Grads = append(view.Grads, g)
			}
			return nil
		}}
	if view.Run, err = r.train(acc); err != nil {
		return view, err
	}
	// A loader whose last round is incomplete: N·b + 1 examples.
	src, err := linSource(acc.WorldSize()*confBatch+1, 0, 0)
	if err != nil {
		return view, err
	}
	tail, err := acc.PrepareDataLoader(src, prepare.BatchSize(confBatch))
	if err != nil {
		return view, err
	}
	for _, err := range tail.All() {
		if err != nil {
			return view, err
		}
		view.Tail = gradientStateOf(acc, tail)
	}
	return view, nil
}

// checkConformance compares n ranks' reports with the hand-computed references.
func checkConformance(t *testing.T, n int, reports []conformanceReport) {
	for _, rep := range reports {
		t.Run(fmt.Sprintf("rank=%d", rep.Rank), func(t *testing.T) {
			t.Run("sync each batch", func(t *testing.T) {
				for _, k := range []int{2, 4} {
					batches := 2*k + 1
					chunks := linChunks(n, k, batches, 1)
					want := linSGD(chunks, constantLRs(len(chunks)), 0)
					plain, each := rep.SyncEachBatch[fmt.Sprintf("K=%d/each=false", k)], rep.SyncEachBatch[fmt.Sprintf("K=%d/each=true", k)]
					assertWeights(t, want, plain.W, "K=%d plain accumulation", k)
					assertWeights(t, want, each.W, "K=%d sync each batch", k)
					assert.EqualValues(t, 3, each.Steps, "K=%d: the optimizer steps every K-th micro-batch and at the end", k)
					assert.EqualValues(t, batches, each.Reductions, "K=%d: every micro-batch is all-reduced", k)
					assert.EqualValues(t, 3, plain.Reductions, "K=%d: plain accumulation all-reduces once per step", k)
					assert.Equal(t, plain.Syncs, each.Syncs, "K=%d: SyncGradients marks the same steps", k)
				}
			})
			t.Run("nested loaders", func(t *testing.T) {
				res := rep.Nested
				assert.Equal(t, []bool{false, true, true, false, true, true}, res.Syncs)
				assert.EqualValues(t, 4, res.Steps)
				assert.Equal(t, []int{0, 0}, res.StepInCycleAfterEpoch, "no micro-batch leaks into the next epoch")
				chunks := linChunks(n, 2, 3, 2)
				for i := range chunks[2:] {
					chunks[2+i] = [2]int{chunks[i][0], chunks[i][1]} // the second epoch repeats the first's order
				}
				assertWeights(t, linSGD(chunks, constantLRs(4), 0), rep.Nested.W, "nested loaders")
			})
			t.Run("regularizer", func(t *testing.T) {
				chunks := linChunks(n, 2, 4, 1)
				want := linSGD(chunks, constantLRs(2), 0.5)
				assertWeights(t, want, rep.Regularized.W, "L2")
				unregularized := linSGD(chunks, constantLRs(2), 0)
				assert.Greater(t, math.Abs(want[0]-unregularized[0]), 1e-3, "the L2 term must matter in this test")
			})
			t.Run("schedules", func(t *testing.T) {
				for _, k := range confKs {
					chunks := linChunks(n, k, 6*k, 1)
					lrs := make([]float64, 6)
					for s := range lrs {
						lrs[s] = cosineRate(s)
					}
					res := rep.Cosine[k]
					assert.EqualValues(t, 6, res.Steps, "K=%d", k)
					assert.Equal(t, []int64{1, 2, 3, 4, 5, 6}, res.Counters, "K=%d: the schedule counts optimizer steps", k)
					assert.InDeltaSlice(t, lrs, res.LRs, confTol, "K=%d: cosine rates per step", k)
					assertWeights(t, linSGD(chunks, lrs, 0), res.W, "K=%d cosine", k)

					chunks = linChunks(n, k, 3*k, 1)
					lrs = []float64{halvingRate(0), halvingRate(1), halvingRate(2)}
					res = rep.Scheduler[k]
					assert.InDeltaSlice(t, lrs, res.LRs, confTol, "K=%d: scheduler rates per step", k)
					assert.InDelta(t, halvingRate(3), res.NextLR, confTol)
					assertWeights(t, linSGD(chunks, lrs, 0), res.W, "K=%d scheduler", k)
				}
				res := rep.Skipped
				assert.EqualValues(t, 2, res.Steps)
				assert.EqualValues(t, 1, res.Skipped)
				assert.Equal(t, []int64{1, 2}, res.Counters, "a skipped step does not advance the schedule")
				chunks := linChunks(n, 2, 6, 1)
				lrs := []float64{cosineRate(0), cosineRate(1)}
				assert.InDeltaSlice(t, lrs, res.LRs, confTol)
				assertWeights(t, linSGD([][2]int{chunks[0], chunks[2]}, lrs, 0), res.W, "skipped step")
			})
			t.Run("gradients and state", func(t *testing.T) {
				checkGradientsView(t, n, rep.Rank, rep.Gradients)
			})
			t.Run("uneven gather", func(t *testing.T) {
				view := rep.Uneven
				wantPadded := unevenRows(rep.Rank)
				for len(wantPadded) < 2*n {
					wantPadded = append(wantPadded, -1)
				}
				assert.Equal(t, n, view.PaddedRows)
				assert.Equal(t, wantPadded, view.Padded)
				var wantRows []int
				var wantAll []float32
				for r := range n {
					wantRows = append(wantRows, r+1)
					wantAll = append(wantAll, unevenRows(r)...)
				}
				assert.Equal(t, wantRows, view.Rows)
				assert.Equal(t, wantAll, view.Gathered)
				assert.Equal(t, []int{n * (n + 1) / 2, 2}, view.Dims)
			})
		})
	}
}

func checkGradientsView(t *testing.T, n, rank int, view gradientsView) {
	chunks := linChunks(n, 2, 3, 1)
	// Micro-batch 0: this rank's examples r, N+r, … scaled by 1/K.
	var mine []int
	for j := range confBatch {
		mine = append(mine, j*n+rank)
	}
	local := linGradOf([2]float64{}, mine)
	// Micro-batch 1 syncs: the mean over the first step's examples, then clipped to half its norm.
	g0 := linGrad([2]float64{}, chunks[0][0], chunks[0][1], 0)
	norm := math.Hypot(g0[0], g0[1])
	f := norm / 2 / (norm + 1e-6)
	clipped0 := [2]float64{g0[0] * f, g0[1] * f}
	w1 := [2]float64{-confLR * clipped0[0], -confLR * clipped0[1]}
	// Micro-batch 2 ends the loader: a short cycle over its examples, clipped to ±clipValue.
	g1 := linGrad(w1, chunks[1][0], chunks[1][1], 0)
	clamp := func(x float64) float64 { return max(min(x, clipValue), -clipValue) }
	clipped1 := [2]float64{clamp(g1[0]), clamp(g1[1])}
	w2 := [2]float64{w1[0] - confLR*clipped1[0], w1[1] - confLR*clipped1[1]}

	want := [][2]float64{{local[0] / 2, local[1] / 2}, g0, clipped0, g1, clipped1}
	require.Len(t, view.Grads, len(want))
	for i, w := range want {
		assert.InDeltaSlice(t, w[:], view.Grads[i], confTol, "gradient view %d", i)
	}
	assert.InDelta(t, norm, view.Norm, confTol, "ClipGradNorm returns the norm before clipping")
	assert.NotEqual(t, g1, clipped1, "the value clip must matter in this test")
	assertWeights(t, w2, view.Run.W, "clipped steps")
	assert.Equal(t, []accelGradientState{
		{SyncGradients: false, EndOfDataloader: false, Active: true, Remainder: 0, StepInCycle: 1},
		{SyncGradients: true, EndOfDataloader: false, Active: true, Remainder: 0, StepInCycle: 2},
		{SyncGradients: true, EndOfDataloader: true, Active: true, Remainder: 0, StepInCycle: 1},
	}, view.State)
	assert.Equal(t, accelGradientState{SyncGradients: true, Remainder: -1}, view.Outer)
	assert.Equal(t, accelGradientState{SyncGradients: true, EndOfDataloader: true, Active: true, Remainder: 1}, view.Tail)
}

func assertWeights(t *testing.T, want [2]float64, got []float64, msgAndArgs ...any) {
	t.Helper()
	assert.InDeltaSlice(t, want[:], got, confTol, msgAndArgs...)
}

// TestConformance runs the conformance checks on 1, 2 and 4 in-process ranks.
func TestConformance(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			reports := make([]conformanceReport, n)
			runRanks(t, n, nil, func(rank int, acc *accel.Accelerator) error {
				comm := acc.Communicator()
				var err error
				reports[rank], err = conformance(func(opts ...accel.Option) (*accel.Accelerator, error) {
					return accel.New(append([]accel.Option{accel.WithCommunicator(comm), accel.WithBackend("go")}, opts...)...)
				})
				return err
			})
			checkConformance(t, n, reports)
		})
	}
}

// TestMPIConformance runs the conformance checks as real MPI jobs of 1, 2 and 4 processes.
func TestMPIConformance(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(func(_ *backends.Communicator) (any, error) {
			return conformance(func(opts ...accel.Option) (*accel.Accelerator, error) {
				return accel.New(append([]accel.Option{accel.WithBackend("go")}, opts...)...)
			})
		}))
		return
	}
	for _, np := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			results := mpitest.Run(t, np, t.Name()[:len("TestMPIConformance")], mpitest.WithTimeout(5*time.Minute))
			reports := make([]conformanceReport, np)
			for r, res := range results {
				require.NoError(t, res.Decode(&reports[r]))
			}
			checkConformance(t, np, reports)
		})
	}
}
