package prepare

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/internal/bucketgraph"
	"github.com/goaccel/goaccel/internal/replicas"
)

// NonFinitePolicy says what an optimizer step does when the synced gradients (or a rank's loss) hold NaN
// or Inf. The check runs on the all-reduced gradients, which are identical on every rank, so every rank
// takes the same decision and replicas never diverge.
type NonFinitePolicy int

const (
	// NonFiniteApply applies the update anyway (GoMLX's behaviour; optimizers may still drop NaN updates
	// when the context parameter optimizers.ParamClipNaN is set).
	NonFiniteApply NonFinitePolicy = iota
	// NonFiniteFail makes Step return a *NonFiniteError and leaves the weights untouched.
	NonFiniteFail
	// NonFiniteSkip skips this optimizer step (weights and optimizer state untouched, accumulators cleared)
	// and counts it in SkippedSteps.
	NonFiniteSkip
)

// NonFiniteError reports synced gradients that are not finite.
type NonFiniteError struct {
	Step int64 // the optimizer step (1-based) that was refused
	// Ranks are the ranks whose loss was NaN or Inf in that step's micro-batches (empty: every loss was
	// finite, and the gradients themselves overflowed).
	Ranks []int
	// FP16 says the gradients travelled as fp16 (accumulate.FP16 compression), whose range ends at ±65504.
	FP16 bool
}

func (e *NonFiniteError) Error() string {
	cause := "every rank's loss was finite: the gradients themselves overflowed"
	if e.FP16 {
		cause += " fp16's range on the wire (±65504): send them as bf16, which has float32's range, or " +
			"scale the loss down"
	}
	switch len(e.Ranks) {
	case 0:
	case 1:
		cause = fmt.Sprintf("rank %d's loss was NaN or Inf", e.Ranks[0])
	default:
		cause = fmt.Sprintf("the losses of ranks %s were NaN or Inf", strings.Trim(fmt.Sprint(e.Ranks), "[]"))
	}
	return fmt.Sprintf("prepare: optimizer step %d: synced gradients hold NaN or Inf (%s); weights left unchanged",
		e.Step, cause)
}

// OptimizerOption configures a prepared optimizer.
type OptimizerOption func(*Optimizer)

// ClipGradNorm scales the synced gradients so that their global L2 norm is at most maxNorm (like
// torch.nn.utils.clip_grad_norm_). It runs on the averaged gradients, so every rank clips identically.
func ClipGradNorm(maxNorm float64) OptimizerOption {
	return func(o *Optimizer) { o.clipNorm = maxNorm }
}

// OnNonFinite sets the policy for NaN or Inf in the synced gradients. The default is NonFiniteApply, as
// GoMLX's own training does, except where gradients travel as fp16 (accumulate.FP16): a sum past ±65504
// becomes Inf there without anything being wrong with the model, so the step is refused (NonFiniteFail)
// unless this option says otherwise.
func OnNonFinite(policy NonFinitePolicy) OptimizerOption {
	return func(o *Optimizer) { o.nonFinite = policy }
}

// ElementWise declares that the optimizer updates each parameter element from that element's gradient,
// value and state alone, as GoMLX's SGD, Adam, AdamW, Adamax and RMSProp do (and an optimizer that
// normalises by a whole tensor's norm, as LAMB does, does not): what a sharding strategy needs to update
// parameter blocks instead of parameters. goaccel knows GoMLX's own optimizers; this option vouches for
// another.
func ElementWise() OptimizerOption { return func(o *Optimizer) { o.elementWise = true } }

// AfterStep runs fn after every applied optimizer step; an error fails the step. The Accelerator's
// replica check hooks in here.
func AfterStep(fn func() error) OptimizerOption {
	return func(o *Optimizer) { o.afterStep = append(o.afterStep, fn) }
}

// Optimizer applies synced gradients with a GoMLX optimizer.
type Optimizer struct {
	model     *Model
	optimizer optimizers.Interface
	withGrads train.OptimizeWithGradients
	clipNorm  float64
	nonFinite NonFinitePolicy
	// elementWise is set when ElementWise vouched for an optimizer goaccel does not know.
	elementWise bool
	afterStep   []func() error
	// beforeStep runs before every applied step, once the update is certain (a Scheduler sets the rate).
	beforeStep []func() error
	scheduler  *Scheduler

	applyExec *context.Exec
	// Under a strategy that splits buckets: the parameter blocks the update runs on, the per-step updates
	// run after the all-gather, and the all-gather's two staging buffers (see shard.go).
	paramShards  []*context.Variable
	perStepExec  *context.Exec
	gathered     [2][]byte
	steps        int64 // optimizer steps applied
	skippedSteps int64
	// local is set under local SGD (Runtime.LocalSGD): the steps since the last average, DiLoCo's state.
	local       *localState
	computeTime time.Duration
}

// NewOptimizer prepares opt for model. opt must implement UpdateGraphWithGradients (GoMLX's SGD and Adam
// do), because goaccel hands it averaged gradients rather than a loss.
func NewOptimizer(model *Model, opt optimizers.Interface, opts ...OptimizerOption) (*Optimizer, error) {
	if model == nil {
		return nil, errors.New("prepare: optimizer needs a prepared model")
	}
	if opt == nil {
		return nil, errors.New("prepare: optimizer is nil")
	}
	withGrads, ok := opt.(train.OptimizeWithGradients)
	if !ok {
		return nil, fmt.Errorf("prepare: optimizer %T cannot take gradients (it does not implement "+
			"UpdateGraphWithGradients); use one that does, such as optimizers.StochasticGradientDescent() or "+
			"optimizers.Adam().Done()", opt)
	}
	o := &Optimizer{model: model, optimizer: opt, withGrads: withGrads, nonFinite: model.rt.defaultNonFinite()}
	if cfg := model.rt.LocalSGD; cfg != nil {
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
		o.local = &localState{cfg: *cfg}
		if cfg.Outer != nil {
			outer := *cfg.Outer
			o.local.cfg.Outer = &outer
		}
	}
	for _, option := range opts {
		option(o)
	}
	if o.clipNorm < 0 || math.IsNaN(o.clipNorm) {
		return nil, fmt.Errorf("prepare: gradient clipping norm must be positive, got %g", o.clipNorm)
	}
	if s := model.rt.sharding(); s.Stage() > 0 && !o.elementWise && !knownElementWise(opt) {
		return nil, fmt.Errorf("prepare: sharding %q updates each process's block of the parameters, which gives "+
			"the replicated update only for an optimizer that updates each element on its own; goaccel does not "+
			"know whether %T does: use replicated sharding, or pass prepare.ElementWise() if it does", s.Name(), opt)
	}
	if model.materialized {
		if err := o.build(); err != nil {
			return nil, err
		}
		// The model's replicas were already synced; the optimizer state is new, so sync it now.
		if err := replicas.BroadcastVariables(model.rt.Comm, model.ReplicatedVariables(), 0); err != nil {
			return nil, err
		}
	} else {
		model.onMaterialize = append(model.onMaterialize, o.build)
	}
	return o, nil
}

// knownElementWise reports whether opt is one of GoMLX's optimizers, all of which update element by element.
func knownElementWise(opt optimizers.Interface) bool {
	if _, ok := opt.(*optimizers.SGDConfig); ok {
		return true
	}
	// Adam, AdamW, Adamax and RMSProp are one unexported type.
	return fmt.Sprintf("%T", opt) == fmt.Sprintf("%T", optimizers.Adam().Done())
}

// build compiles the update step, which creates the optimizer's state variables, and initialises them.
func (o *Optimizer) build() (err error) {
	defer recovered("prepare: building the optimizer step", &err)
	m := o.model
	if m.sharding.Stage() > 0 {
		return o.buildSharded()
	}
	probeGraph(m.rt, "goaccel_optimizer_probe", []any{tensors.FromScalar(1.0)}, func(g *Graph, params []*Node) {
		o.applyGraph(m.ctx, params[0])
	})
	if err := m.ctx.InitializeVariables(m.rt.Backend, nil); err != nil {
		return fmt.Errorf("prepare: initialising optimizer state: %w", err)
	}
	o.applyExec, err = context.NewExec(m.rt.Backend, m.ctx.Reuse(), o.applyGraph)
	if err != nil {
		return fmt.Errorf("prepare: creating the optimizer step: %w", err)
	}
	return nil
}

// buildSharded is build under a strategy that splits buckets: the update runs on parameter blocks.
func (o *Optimizer) buildSharded() (err error) {
	m := o.model
	o.buildShards()
	one := tensors.FromScalar(1.0)
	probeGraph(m.rt, "goaccel_optimizer_probe", []any{one, one}, func(g *Graph, params []*Node) {
		o.applyShardedGraph(m.ctx, params[0], params[1])
	})
	if err := m.ctx.InitializeVariables(m.rt.Backend, nil); err != nil {
		return fmt.Errorf("prepare: initialising optimizer state: %w", err)
	}
	if o.applyExec, err = context.NewExec(m.rt.Backend, m.ctx.Reuse(), o.applyShardedGraph); err != nil {
		return fmt.Errorf("prepare: creating the optimizer step: %w", err)
	}
	if len(m.perStepUpdates) > 0 {
		if o.perStepExec, err = context.NewExec(m.rt.Backend, m.ctx.Reuse(), o.perStepGraph); err != nil {
			return fmt.Errorf("prepare: creating the per-step updates: %w", err)
		}
	}
	return nil
}

// applyGraph is the compiled optimizer step: it scales the all-reduced buckets into the mean gradient,
// slices them back into parameter shapes, optionally clips them and hands them to the optimizer. It leaves
// the accumulators as they are (Reducer.AppliedLeavingSums): the next micro-batch sets them, and writing
// zeros there first cost a pass over every bucket per step (an eighth of a step of the bag-of-words model,
// whose 8 MB embedding gradient is the bucket).
func (o *Optimizer) applyGraph(ctx *context.Context, scale *Node) {
	m := o.model
	g := scale.Graph()
	ctx.SetTraining(g, true)
	grads := bucketgraph.Unflatten(m.plan, trainedWith(g, m.params, m.buckets, scale))
	if o.clipNorm > 0 {
		grads = clipByGlobalNorm(grads, o.clipNorm)
	}
	o.withGrads.UpdateGraphWithGradients(ctx, grads, m.lossDType)
	// What the model registered with train.AddPerStepUpdateGraphFn, after the update, as GoMLX's Trainer.
	for _, u := range m.perStepUpdates {
		u.fn(ctx.InAbsPath(u.scope), g)
	}
	train.ExecPerStepUpdateGraphFn(ctx, g)
}

// applySharded is the step under a strategy that splits buckets: refresh the parameter blocks, update them,
// all-gather them into the parameters, run the per-step updates, and zero the accumulators the sync read.
func (o *Optimizer) applySharded(clip float64) error {
	m := o.model
	if err := m.rt.inPhase(PhaseRefresh, o.steps+1, o.refreshShards); err != nil {
		return err
	}
	if err := m.rt.inPhase(PhaseUpdate, o.steps+1, func() error {
		_, err := o.applyExec.Exec(m.scalars.get(m.reducer.Scale()), m.scalars.get(clip))
		return err
	}); err != nil {
		return err
	}
	if err := m.rt.inPhase(PhaseAllGather, o.steps+1, o.gatherShards); err != nil {
		return err
	}
	if o.perStepExec != nil {
		if _, err := o.perStepExec.Exec(m.scalars.get(1.0)); err != nil {
			return fmt.Errorf("per-step updates: %w", err)
		}
	}
	if m.reducer.Dirty() {
		return m.reducer.ZeroAccumulators()
	}
	return nil
}

// trainedWith readies an update of trained by the sums in synced: it uses every trained variable first
// (GoMLX optimizers update the trainable variables the graph uses, in registration order, matching gradients
// by position, so the two lists line up) and returns the sums times scale, the mean gradient.
func trainedWith(g *Graph, trained, synced []*context.Variable, scale *Node) []*Node {
	for _, v := range trained {
		v.ValueGraph(g)
	}
	means := make([]*Node, len(synced))
	for b, v := range synced {
		value := v.ValueGraph(g)
		means[b] = Mul(value, ConvertDType(scale, value.DType()))
	}
	return means
}

// clipByGlobalNorm scales every gradient by min(1, maxNorm/‖grads‖₂), the norm taken over all of them.
func clipByGlobalNorm(grads []*Node, maxNorm float64) []*Node {
	g := grads[0].Graph()
	sumSquares := ScalarZero(g, grads[0].DType())
	for _, grad := range grads {
		sumSquares = Add(sumSquares, ConvertDType(ReduceAllSum(Square(grad)), grads[0].DType()))
	}
	norm := Sqrt(sumSquares)
	factor := Min(OnesLike(norm), Div(Scalar(g, norm.DType(), maxNorm), Max(norm, Scalar(g, norm.DType(), 1e-12))))
	clipped := make([]*Node, len(grads))
	for i, grad := range grads {
		clipped[i] = Mul(grad, ConvertDType(factor, grad.DType()))
	}
	return clipped
}

// Step applies the synced gradients and reports whether it did. On steps that did not sync (inside
// NoSync, or a non-final micro-batch inside Accumulate) it does nothing, as in Accelerate.
func (o *Optimizer) Step() (stepped bool, err error) {
	defer recovered("prepare: optimizer step", &err)
	m := o.model
	if err := m.rt.checkOpen("optimizer step"); err != nil {
		return false, err
	}
	if m.reducer == nil || !m.reducer.ReadyToApply() {
		return false, nil
	}
	if o.applyExec == nil {
		return false, errors.New("prepare: optimizer step before the model was built")
	}
	defer m.rt.endPhase(m.rt.beginPhase(PhaseOptimizerStep, o.steps+1, false))
	if o.local != nil {
		if err := o.beginLocalStep(); err != nil {
			return false, err
		}
	}
	// Under a strategy that splits buckets the norm and the finiteness of the synced gradients are known
	// only across ranks: one collective serves both.
	clip := 1.0
	finite := true
	if m.reducer.Sharded() && (o.nonFinite != NonFiniteApply || o.clipNorm > 0) {
		sumSquares, err := m.reducer.SyncedSumSquares()
		if err != nil {
			return false, err
		}
		finite = !math.IsNaN(sumSquares) && !math.IsInf(sumSquares, 0)
		norm := math.Sqrt(sumSquares) * m.reducer.Scale()
		if o.clipNorm > 0 && finite {
			clip = math.Min(1, o.clipNorm/math.Max(norm, 1e-12))
		}
	}
	if o.nonFinite != NonFiniteApply {
		if !m.reducer.Sharded() {
			if finite, err = m.reducer.Finite(); err != nil {
				return false, err
			}
		}
		if !finite {
			refused := o.steps + o.skippedSteps + 1
			var ranks []int
			if o.nonFinite == NonFiniteFail {
				if ranks, err = m.reducer.NonFiniteRanks(); err != nil {
					return false, err
				}
			}
			if err := m.reducer.Clear(); err != nil {
				return false, err
			}
			// A schedule in the model function counts applied steps only.
			if err := m.rewindSchedule(); err != nil {
				return false, err
			}
			if o.nonFinite == NonFiniteSkip {
				o.skippedSteps++
				if o.local != nil {
					// Each process decides on its own gradients under local SGD, and all count the step.
					return false, o.endLocalStep()
				}
				return false, nil
			}
			return false, &NonFiniteError{Step: refused, Ranks: ranks, FP16: m.rt.sendsFP16()}
		}
	}
	for _, fn := range o.beforeStep {
		if err := fn(); err != nil {
			return false, fmt.Errorf("prepare: before optimizer step %d: %w", o.steps+1, err)
		}
	}
	start := time.Now()
	if m.reducer.Sharded() {
		err = o.applySharded(clip)
	} else {
		_, err = o.applyExec.Exec(m.scalars.get(m.reducer.Scale()))
	}
	o.computeTime += time.Since(start)
	if err != nil {
		return false, fmt.Errorf("prepare: optimizer step: %w", err)
	}
	if m.reducer.Sharded() {
		m.reducer.Applied()
	} else {
		m.reducer.AppliedLeavingSums()
	}
	m.scheduleBefore = m.scheduleBefore[:0]
	o.steps++
	if o.local != nil {
		if err := o.endLocalStep(); err != nil {
			return true, err
		}
	}
	for _, fn := range o.afterStep {
		if err := fn(); err != nil {
			return true, fmt.Errorf("prepare: after optimizer step %d: %w", o.steps, err)
		}
	}
	return true, nil
}

// ZeroGrad clears the accumulated gradients. Like Step it is a no-op on steps that did not sync
// (SyncGradients reports which), so the same loop body works with and without accumulation.
func (o *Optimizer) ZeroGrad() error {
	m := o.model
	if m.reducer == nil {
		// Nothing accumulated in this model yet; a new accumulation starts all the same.
		if m.rt.State.SyncGradients() {
			m.rt.State.ResetMicroBatches()
		}
		return nil
	}
	return m.reducer.ZeroGrad()
}

// Steps is the number of optimizer steps applied.
func (o *Optimizer) Steps() int64 { return o.steps }

// SkippedSteps is the number of steps skipped by the NonFiniteSkip policy.
func (o *Optimizer) SkippedSteps() int64 { return o.skippedSteps }

// ComputeTime is the time spent in optimizer updates.
func (o *Optimizer) ComputeTime() time.Duration { return o.computeTime }

func (o *Optimizer) restore(steps, skipped int64) { o.steps, o.skippedSteps = steps, skipped }

// Model is the model this optimizer updates.
func (o *Optimizer) Model() *Model { return o.model }
