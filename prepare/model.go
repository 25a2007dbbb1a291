package prepare

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/initializers"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/blockstate"
	"github.com/goaccel/goaccel/internal/bucketgraph"
	"github.com/goaccel/goaccel/internal/heap"
	"github.com/goaccel/goaccel/internal/replicas"
)

// ModelFn builds the forward graph: it maps input nodes to predictions (for a classifier, logits). It is
// GoMLX graph-building code: create variables through ctx (layers.Dense and friends do).
type ModelFn func(ctx *context.Context, inputs []*Node) []*Node

// LossFn is GoMLX's loss signature (losses.SparseCategoricalCrossEntropyLogits, losses.MeanSquaredError,
// …). It must return a scalar; a mean-reduced loss gives gradients whose scale does not depend on the
// batch size, which is what makes N ranks × K micro-batches equal one big batch.
type LossFn = losses.LossFn

// bucketScope is the absolute context scope of the gradient accumulators (one flat variable per bucket).
const bucketScope = "/goaccel/buckets"

// Model is a GoMLX model prepared for the job: its backward pass adds each micro-batch's gradients into
// bucket-flat accumulators and, on sync steps, all-reduces them.
type Model struct {
	rt      *Runtime
	ctx     *context.Context
	modelFn ModelFn
	lossFn  LossFn

	materialized bool
	// firstInputs/firstLabels are the shapes of the batch the model was materialised with; only the batch
	// (first) dimension may differ later.
	firstInputs, firstLabels []shapes.Shape
	lossDType                dtypes.DType
	// labelClasses is the model's number of classes when its labels are class indices (integer labels
	// shaped as its first output without the class axis), else 0: Backward checks every label against it.
	labelClasses int
	// perStepUpdates are the model's train.AddPerStepUpdateGraphFn functions, run after each optimizer update.
	perStepUpdates []perStepUpdate
	// activationBytes estimates the memory one training step needs beyond the variables (see peakLiveBytes).
	activationBytes float64

	params  []*context.Variable // trainable variables used by the model, registration order (= Plan.Params)
	plan    accumulate.Plan
	buckets []*context.Variable // accumulator per bucket (under ShardGradients, made when first needed)
	// sharding is the job's strategy, Replicated on one process; gradShards receive this rank's block of
	// each synced bucket under a strategy that splits buckets.
	sharding   accumulate.Sharding
	gradShards []*context.Variable
	// reducer owns the synchronisation: it decides which micro-batches sync, syncs them, and keeps the
	// state of the accumulators between optimizer steps.
	reducer *accumulate.Reducer

	// execs are the compiled micro-steps, made on first use: [withOutputs][emit][fresh]. withOutputs also
	// outputs predictions and metrics; emit outputs the gradients instead of adding them into the
	// accumulators (ShardGradients, on a micro-batch that syncs straight after a step); fresh sets the
	// accumulators to the gradients without reading them, when they are known to hold zeros (the first
	// micro-batch after a step).
	execs     [2][2][2]*context.Exec
	metricsFn MetricsFn
	// numOutputs is the number of predictions the model function returns.
	numOutputs int
	evalExec   *context.Exec

	// onMaterialize runs after the plan exists and variables are initialised, before replicas are synced:
	// optimizers prepared before the first batch build their state here so it is broadcast too.
	onMaterialize []func() error
	// extraReplicated are variables (optimizer state) broadcast along with the model's.
	extraReplicated func() []*context.Variable

	// scheduleVars are the variables the model function updates in an optimizer scope (a learning-rate
	// schedule's step counter and rate): their updates are kept only on the micro-batch whose optimizer
	// step follows, so schedules count optimizer steps, not micro-batches. scheduleBefore holds their values
	// from before that micro-batch, restored if the step is skipped.
	scheduleVars   []*context.Variable
	scheduleBefore []*tensors.Tensor

	// buffers are the non-trainable variables the training step changes (batch normalisation's moving
	// averages), synchronised across ranks as bufferSync says (see buffers.go).
	buffers    []*context.Variable
	bufferSync BufferSync

	computeTime time.Duration
	microSteps  int64
	// scalars are the scale, advance and sync-scale arguments of the compiled steps, kept on the device.
	scalars deviceScalars
}

// NewModel prepares a model. Variables are created (or reused, if ctx already has them) the first time a
// batch is seen, because GoMLX creates variables while building the graph for concrete input shapes; pass
// an example batch to Materialize to do it earlier.
func NewModel(rt *Runtime, ctx *context.Context, modelFn ModelFn, lossFn LossFn, opts ...ModelOption) (*Model, error) {
	if err := rt.validate(); err != nil {
		return nil, err
	}
	switch {
	case ctx == nil:
		return nil, errors.New("prepare: model needs a GoMLX *context.Context holding its variables")
	case modelFn == nil:
		return nil, errors.New("prepare: model function is nil")
	case lossFn == nil:
		return nil, errors.New("prepare: loss function is nil")
	}
	m := &Model{rt: rt, ctx: ctx, modelFn: modelFn, lossFn: lossFn, scalars: deviceScalars{backend: rt.Backend}}
	for _, opt := range opts {
		opt(m)
	}
	if !m.bufferSync.Valid() {
		return nil, fmt.Errorf("prepare: buffer sync must be BroadcastBuffers, AverageBuffers or NoBufferSync, got %s",
			m.bufferSync)
	}
	return m, nil
}

// ModelOption configures a prepared model.
type ModelOption func(*Model)

// MetricsFn computes in-graph training metrics (accuracy, …) from a micro-batch's labels and the model's
// predictions, in the training graph, so that reading them costs no second forward pass.
type MetricsFn func(ctx *context.Context, labels, predictions []*Node) []*Node

// TrainMetrics makes BackwardOutputs also return fn's metrics for each micro-batch.
func TrainMetrics(fn MetricsFn) ModelOption { return func(m *Model) { m.metricsFn = fn } }

// BackwardResult is what BackwardOutputs returns for one micro-batch on this rank.
type BackwardResult struct {
	// Loss is what is optimised: the loss function's value plus the terms the model added with
	// train.AddLoss (regularizers); DataLoss is the loss function's value alone.
	Loss, DataLoss float64
	// Outputs are the model function's outputs (predictions) for the batch, computed in training mode.
	Outputs []*tensors.Tensor
	// Metrics are the TrainMetrics function's values; nil without one.
	Metrics []*tensors.Tensor
}

// Context is the GoMLX context holding the model's variables.
func (m *Model) Context() *context.Context { return m.ctx }

// Materialized reports whether the model's variables and bucket plan exist.
func (m *Model) Materialized() bool { return m.materialized }

// Plan is the bucket plan (valid once materialised).
func (m *Model) Plan() accumulate.Plan { return m.plan }

// Parameters are the trainable variables the model uses, in registration order (valid once materialised).
func (m *Model) Parameters() []*context.Variable { return m.params }

// Reducer is the model's gradient reducer, which owns the accumulators and their synchronisation (valid
// once materialised).
func (m *Model) Reducer() *accumulate.Reducer { return m.reducer }

// ComputeTime is the time spent running the model's micro-batch steps.
func (m *Model) ComputeTime() time.Duration { return m.computeTime }

// MicroSteps is the number of micro-batches run through Backward.
func (m *Model) MicroSteps() int64 { return m.microSteps }

// Materialize builds the model for the shapes of the example batch: it creates and initialises the
// variables, plans the buckets, lets prepared optimizers build their state, and makes every rank's
// replica identical to rank 0's. Collective: every rank must call it (Backward does on its first call).
func (m *Model) Materialize(batch Batch) (err error) {
	if m.materialized {
		return nil
	}
	defer func() {
		// Runs after recovered (deferred first): a loss reads its labels: with none, GoMLX's loss functions index an empty slice and the panic
		// says only "index out of range".
		if err != nil && len(batch.Labels) == 0 {
			err = fmt.Errorf("%w (the batch has no labels: Backward passes batch.Labels to the loss function; "+
				"give the source labels, or use Predict for inputs alone)", err)
		}
	}()
	defer recovered("prepare: building the model", &err)
	if len(batch.Inputs) == 0 {
		return errors.New("prepare: batch has no inputs")
	}
	m.firstInputs, m.firstLabels = tensorShapes(batch.Inputs), tensorShapes(batch.Labels)
	// Build the training graph once without running it: that creates the variables and the bucket plan.
	// (A context.Exec's PreCompile would donate the buffers of the variables the graph changes.)
	probeGraph(m.rt, "goaccel_model_probe", m.microStepArgs(batch, 1, true), func(g *Graph, params []*Node) {
		outputs := m.microStepGraph(m.ctx, params)
		m.activationBytes = peakLiveBytes(g, outputs)
	})
	if err := m.checkMemory(); err != nil {
		return err
	}
	if err := m.ctx.InitializeVariables(m.rt.Backend, nil); err != nil {
		return fmt.Errorf("prepare: initialising variables: %w", err)
	}
	// Every variable exists now: the executors reuse them, and would fail loudly on a new one.
	emitFirst := m.sharding.Stage() == 2 // the first micro-batch starts clean: it emits, or sets the accumulators
	if _, err := m.exec(false, emitFirst, freshAccumulators && !emitFirst); err != nil {
		return err
	}
	reducerOpts := []accumulate.ReducerOption{accumulate.WithGradientState(m.rt.State),
		accumulate.WithAccumulators(m.buckets), accumulate.WithCommHook(m.rt.commHook()),
		accumulate.WithSharding(m.sharding), accumulate.WithShards(m.gradShards),
		accumulate.WithAccumulatorMaker(m.makeAccumulators)}
	if m.rt.local() {
		reducerOpts = append(reducerOpts, accumulate.WithLocalGradients())
	}
	m.reducer = accumulate.NewReducer(m.rt.Comm, m.plan, reducerOpts...)
	m.materialized = true
	for _, hook := range m.onMaterialize {
		if err := hook(); err != nil {
			m.materialized = false
			return err
		}
	}
	if err := replicas.CheckSameSignature(m.rt.Comm, "bucket plans", m.plan.Signature()); err != nil {
		m.materialized = false
		return err
	}
	// The generator state travels with the weights, so that every rank derives its own from rank 0's; so
	// do buffers kept per rank, which start from rank 0's.
	shared := append(m.ReplicatedVariables(), m.perRankBuffers()...)
	if rng := m.RNGVariable(); rng != nil {
		shared = append(shared, rng)
	}
	if err := replicas.BroadcastVariables(m.rt.Comm, shared, 0); err != nil {
		m.materialized = false
		return err
	}
	if err := m.seedRank(); err != nil {
		m.materialized = false
		return err
	}
	// What setting up left behind (each rank's own initial values, overwritten by rank 0's; sharded, the
	// replicated copies the blocks were cut from) is a whole model's worth: freed now, the collector's
	// goals follow what training keeps.
	heap.Settle()
	return nil
}

// ReplicatedVariables are the variables every rank must hold identically: everything in the context but
// the gradient accumulators and the random number generator state, which are per-rank by nature (see
// RNGVariable), and, with NoBufferSync, the buffers. Buffers are identical after every optimizer step,
// not inside an accumulation cycle (see Buffers).
func (m *Model) ReplicatedVariables() []*context.Variable {
	var vars []*context.Variable
	for v := range m.ctx.IterVariables() {
		if isBucketVariable(v) || blockstate.IsBlockVariable(v) || isRNGVariable(v) || m.isPerRankBuffer(v) {
			continue
		}
		vars = append(vars, v)
	}
	return vars
}

func isBucketVariable(v *context.Variable) bool { return v.Scope() == bucketScope }

// exec is the compiled micro-step for withOutputs, emit and fresh, made on first use.
func (m *Model) exec(withOutputs, emit, fresh bool) (*context.Exec, error) {
	o, e, f := boolToInt(withOutputs), boolToInt(emit), boolToInt(fresh)
	if m.execs[o][e][f] != nil {
		return m.execs[o][e][f], nil
	}
	exec, err := context.NewExec(m.rt.Backend, m.ctx.Reuse(), func(ctx *context.Context, nodes []*Node) []*Node {
		return m.buildMicroStep(ctx, nodes, withOutputs, emit, fresh)
	})
	if err != nil {
		return nil, fmt.Errorf("prepare: creating the training step: %w", err)
	}
	exec.SetMaxCache(16)
	m.execs[o][e][f] = exec
	return exec, nil
}

// freshAccumulators lets the first micro-batch after a step set the accumulators instead of adding into
// them (see Model.execs); tests turn it off to compare.
var freshAccumulators = true

// makeAccumulators makes the whole-bucket accumulators that ShardGradients leaves out until a micro-batch
// accumulates without syncing, and tells the reducer.
func (m *Model) makeAccumulators() ([]*context.Variable, error) {
	if m.buckets != nil {
		return m.buckets, nil
	}
	bucketCtx := m.ctx.InAbsPath(bucketScope).Checked(false)
	size := m.rt.Comm.Size()
	buckets := make([]*context.Variable, len(m.plan.Buckets))
	for b, bucket := range m.plan.Buckets {
		zeros := tensors.FromShape(shapes.Make(bucket.DType, m.sharding.Padded(bucket.Size, size)))
		buckets[b] = bucketCtx.VariableWithValue(fmt.Sprintf("bucket_%03d", b), zeros).SetTrainable(false)
	}
	m.buckets = buckets
	return buckets, nil
}

// microStepOutputsGraph is microStepGraph that also outputs the predictions and the training metrics.
func (m *Model) microStepOutputsGraph(ctx *context.Context, nodes []*Node) []*Node {
	return m.buildMicroStep(ctx, nodes, true, false, false)
}

// microStepGraph is the compiled micro-batch step: forward, loss, gradients of the planned parameters,
// flattened and added (times the micro-batch scale) into the bucket accumulators. Outputs the loss.
// perStepUpdate is a function the model registered with train.AddPerStepUpdateGraphFn (regularizers.L1
// zeroing the weights under its amount, a constraint on a layer's weights), and the scope it registered in.
type perStepUpdate struct {
	scope string
	fn    train.ContextGraphFn
}

// collectPerStepUpdates keeps the per-step updates the model function registered on g. GoMLX's Trainer
// runs them in the graph of its training step, after the optimizer's update; goaccel's update is another
// graph (the optimizer's apply step), so they are carried there (Optimizer.applyGraph).
func (m *Model) collectPerStepUpdates(ctx *context.Context, g *Graph) {
	updates := map[string]train.ContextGraphFn{}
	ctx.EnumerateGraphParams(g, func(scope, key string, value any) {
		if fn, ok := value.(train.ContextGraphFn); ok && key == train.TrainerPerStepUpdateGraphFnParamKey {
			updates[scope] = fn
		}
	})
	m.perStepUpdates = m.perStepUpdates[:0]
	for _, scope := range slices.Sorted(maps.Keys(updates)) {
		m.perStepUpdates = append(m.perStepUpdates, perStepUpdate{scope: scope, fn: updates[scope]})
	}
}

func (m *Model) microStepGraph(ctx *context.Context, nodes []*Node) []*Node {
	return m.buildMicroStep(ctx, nodes, false, false, false)
}

func (m *Model) buildMicroStep(ctx *context.Context, nodes []*Node, withOutputs, emit, fresh bool) []*Node {
	g := nodes[0].Graph()
	ctx.SetTraining(g, true)
	nIn, nLab := len(m.firstInputs), len(m.firstLabels)
	if len(nodes) != nIn+nLab+2 {
		panic(fmt.Sprintf("training step built with %d inputs and %d labels, got %d nodes", nIn, nLab, len(nodes)))
	}
	inputs, labels, scale, advance := nodes[:nIn], nodes[nIn:nIn+nLab], nodes[nIn+nLab], nodes[nIn+nLab+1]
	// Read the schedule variables before the model function moves them, to keep their old values on
	// micro-batches that do not step.
	before := make([]*Node, len(m.scheduleVars))
	for i, v := range m.scheduleVars {
		before[i] = v.ValueGraph(g)
	}
	predictions := m.modelFn(ctx, inputs)
	loss := m.lossFn(labels, predictions)
	dataLoss := loss // before the regularizers the model added with train.AddLoss
	if loss == nil {
		panic("the loss function returned nil")
	}
	if !loss.Shape().IsScalar() {
		panic(fmt.Sprintf("the loss must be a scalar (reduce it with ReduceAllMean), got shape %s", loss.Shape()))
	}
	// Terms the model added with train.AddLoss (regularizers such as regularizers.L2 on layers.Dense) are
	// part of what is optimised, as in GoMLX's Trainer.
	train.SetLossNoRegularization(ctx, loss)
	train.AddLoss(ctx, loss)
	loss = train.GetLosses(ctx, g)
	m.collectPerStepUpdates(ctx, g)
	if m.plan.Params == nil {
		m.planFromGraph(ctx, g)
		m.lossDType = loss.DType()
		m.labelClasses = sparseClasses(labels, predictions)
		m.scheduleVars = scheduleVariables(ctx, g)
		m.buffers = bufferVariables(ctx, g)
	} else {
		for i, v := range m.scheduleVars {
			if v.ChangedInGraph(g) {
				v.SetValueGraph(Where(advance, v.ValueGraph(g), before[i]))
			}
		}
	}
	values := make([]*Node, len(m.params))
	for i, v := range m.params {
		values[i] = v.ValueGraph(g)
	}
	// Scaling the scalar loss scales every gradient alike, for one multiply instead of a pass over every
	// gradient byte per micro-batch (which the pure-Go backend runs as a broadcast and a multiply).
	grads := differentiate(Mul(loss, ConvertDType(scale, loss.DType())), values)
	flats := bucketgraph.Flatten(m.plan, grads)
	size := m.rt.Comm.Size()
	for b, bucket := range m.plan.Buckets {
		// A strategy that splits buckets pads each to a multiple of the world size; the padding stays zero.
		if pad := m.sharding.Padded(bucket.Size, size) - bucket.Size; pad > 0 {
			flats[b] = Concatenate([]*Node{flats[b], Zeros(g, shapes.Make(bucket.DType, pad))}, 0)
		}
	}
	lossOut := ConvertDType(loss, dtypes.Float64)
	if !emit {
		overlap := m.rt.Overlap && size > 1 && m.sharding.Stage() == 0
		for b, acc := range m.buckets {
			var sum *Node
			if fresh {
				// The accumulator holds zeros: x + 0 is 0 + x to the bit (−0 included), without reading it.
				// Its value is still a parameter of the graph, which nothing computes with: GoMLX's context
				// executor hands a variable the graph sets to its parameter (donating the old buffer).
				_ = acc.ValueGraph(g)
				sum = Add(flats[b], Scalar(g, acc.Shape().DType, 0))
			} else {
				sum = Add(acc.ValueGraph(g), flats[b])
			}
			if overlap {
				// The bucket's final value on a micro-batch that syncs: the step hands it to the reducer as
				// soon as it is computed, and the reducer starts its all-reduce while the backward goes on.
				sum, _ = cpu.MarkReady(sum, lossOut, b, func(flat any, loss float64) {
					m.reducer.BucketReady(b, flat, loss)
				})
			}
			acc.SetValueGraph(sum)
		}
	}
	out := []*Node{lossOut, ConvertDType(dataLoss, dtypes.Float64)}
	if withOutputs {
		m.numOutputs = len(predictions)
		out = append(out, predictions...)
		if m.metricsFn != nil {
			out = append(out, m.metricsFn(ctx, labels, predictions)...)
		}
	}
	if emit {
		out = append(out, flats...)
	}
	return out
}

// differentiate is GoMLX's Gradient of loss with respect to values, whose panic — an operation of the
// model without a gradient names itself there — says that it arose while differentiating, not while the
// model function ran.
func differentiate(loss *Node, values []*Node) (grads []*Node) {
	defer func() {
		if r := recover(); r != nil {
			if err, ok := r.(error); ok {
				panic(fmt.Errorf("differentiating the loss: %w", err))
			}
			panic(fmt.Sprintf("differentiating the loss: %v", r))
		}
	}()
	return Gradient(loss, values...)
}

// planFromGraph runs once, while the first training graph is built: the model function has just created
// its variables, so the trainable ones this graph uses are the parameters to plan buckets for.
func (m *Model) planFromGraph(ctx *context.Context, g *Graph) {
	var params []accumulate.Param
	for v := range ctx.IterVariables() {
		if v.Trainable && v.InUseByGraph(g) {
			m.params = append(m.params, v)
			params = append(params, accumulate.Param{Name: v.ScopeAndName(), Shape: v.Shape()})
		}
	}
	if len(params) == 0 {
		panic("the model has no trainable variables: create them through the context given to the model function")
	}
	plan, err := accumulate.NewPlan(params, m.rt.FirstBucketBytes, m.rt.BucketCapBytes)
	if err != nil {
		panic(err)
	}
	m.plan = plan
	m.sharding = m.rt.sharding()
	size := m.rt.Comm.Size()
	if m.sharding.Stage() < 2 {
		bucketCtx := ctx.InAbsPath(bucketScope).Checked(false).WithInitializer(initializers.Zero)
		m.buckets = make([]*context.Variable, len(plan.Buckets))
		for b, bucket := range plan.Buckets {
			m.buckets[b] = bucketCtx.VariableWithShape(fmt.Sprintf("bucket_%03d", b),
				shapes.Make(bucket.DType, m.sharding.Padded(bucket.Size, size))).SetTrainable(false)
		}
	}
	if m.sharding.Stage() > 0 {
		shardCtx := ctx.InAbsPath(blockstate.Scope).Checked(false).WithInitializer(initializers.Zero)
		m.gradShards = make([]*context.Variable, len(plan.Buckets))
		for b, bucket := range plan.Buckets {
			m.gradShards[b] = shardCtx.VariableWithShape(blockstate.GradBlockName(b),
				shapes.Make(bucket.DType, accumulate.BlockLen(bucket.Size, size))).SetTrainable(false)
		}
	}
}

// scheduleVariables are the non-trainable variables the model function changed in g inside an
// optimizers scope: what GoMLX's learning-rate schedules (cosineschedule) update from the model function.
func scheduleVariables(ctx *context.Context, g *Graph) []*context.Variable {
	var vars []*context.Variable
	for v := range ctx.IterVariables() {
		if v.Trainable || isBucketVariable(v) || !v.ChangedInGraph(g) {
			continue
		}
		if slices.Contains(strings.Split(v.Scope(), context.ScopeSeparator), optimizers.Scope) {
			vars = append(vars, v)
		}
	}
	return vars
}

// microStepArgs are the micro-step's arguments: the batch, the gradient scale, and whether the optimizer
// steps after this micro-batch (advance, which lets schedules move).
func (m *Model) microStepArgs(batch Batch, scale float64, advance bool) []any {
	args := make([]any, 0, len(batch.Inputs)+len(batch.Labels)+2)
	for _, t := range batch.Inputs {
		args = append(args, t)
	}
	for _, t := range batch.Labels {
		args = append(args, t)
	}
	return append(args, m.scalars.get(scale), m.scalars.get(advance))
}

// checkBatch compares a batch with the shapes the model was built for: only the batch dimension may vary
// (GoMLX compiles a new graph per shape, which is fine for a short last batch but not for new features).
// sparseClasses recognises labels that are class indices of the first prediction: one integer label
// tensor shaped as the prediction without its last (class) axis, or with that axis of size 1, against at
// least two classes. It returns the number of classes, or 0.
func sparseClasses(labels, predictions []*Node) int {
	if len(labels) != 1 || len(predictions) == 0 || !labels[0].DType().IsInt() {
		return 0
	}
	label, prediction := labels[0].Shape(), predictions[0].Shape()
	if prediction.Rank() < 2 {
		return 0
	}
	classes := prediction.Dimensions[prediction.Rank()-1]
	outer := prediction.Dimensions[:prediction.Rank()-1]
	switch {
	case classes < 2:
		return 0
	case slices.Equal(label.Dimensions, outer):
	case label.Rank() == prediction.Rank() && slices.Equal(label.Dimensions[:label.Rank()-1], outer) &&
		label.Dimensions[label.Rank()-1] == 1:
	default:
		return 0
	}
	return classes
}

// checkLabels refuses a batch whose class-index labels fall outside the model's classes: a sparse
// cross-entropy gives such a label a loss of 0 instead of an error, so the job would train on garbage
// without a sign. Labels are a few integers per example, read where the batch already is.
func (m *Model) checkLabels(batch Batch) error {
	if m.labelClasses == 0 || len(batch.Labels) != 1 {
		return nil
	}
	value, at, err := firstLabelOutside(batch.Labels[0], m.labelClasses)
	if err != nil || at < 0 {
		return err
	}
	where := fmt.Sprintf("example %d of the batch", at)
	if at < len(batch.Indices) {
		where += fmt.Sprintf(" (source example %d)", batch.Indices[at])
	}
	return fmt.Errorf("prepare: the label of %s is %d, not a class of the model's %d outputs [0, %d): a sparse "+
		"cross-entropy would count it as a loss of 0", where, value, m.labelClasses, m.labelClasses)
}

func (m *Model) checkBatch(batch Batch) error {
	examples := -1
	if len(batch.Inputs) > 0 && batch.Inputs[0].Shape().Rank() > 0 {
		examples = batch.Inputs[0].Shape().Dimensions[0]
	}
	check := func(kind string, want []shapes.Shape, got []*tensors.Tensor) error {
		if len(got) != len(want) {
			return fmt.Errorf("prepare: batch has %d %s, the model was built with %d", len(got), kind, len(want))
		}
		for i, t := range got {
			s := t.Shape()
			w := want[i]
			if s.DType != w.DType {
				return fmt.Errorf("prepare: batch %s #%d has dtype %s, the model was built with %s", kind, i, s.DType, w.DType)
			}
			if s.Rank() != w.Rank() || s.Rank() == 0 {
				return fmt.Errorf("prepare: batch %s #%d has shape %s, the model was built with %s", kind, i, s, w)
			}
			for axis := 1; axis < s.Rank(); axis++ {
				if s.Dimensions[axis] != w.Dimensions[axis] {
					return fmt.Errorf("prepare: batch %s #%d has shape %s, the model was built with %s: only the "+
						"batch (first) dimension may change", kind, i, s, w)
				}
			}
			if s.Dimensions[0] != examples {
				return fmt.Errorf("prepare: batch %s #%d has %d examples, inputs #0 has %d", kind, i, s.Dimensions[0],
					examples)
			}
		}
		return nil
	}
	if err := check("inputs", m.firstInputs, batch.Inputs); err != nil {
		return err
	}
	return check("labels", m.firstLabels, batch.Labels)
}

// Backward runs one compiled forward and backward pass on batch, adds the gradients (times scale) into
// the accumulators and, when the gradient state says this step syncs, all-reduces them (with
// sync-each-batch, every micro-batch inside Accumulate is all-reduced). It returns the batch's loss on this
// rank, with the terms the model added with train.AddLoss.
func (m *Model) Backward(batch Batch, scale float64) (loss float64, err error) {
	res, err := m.backward(batch, scale, false)
	return res.Loss, err
}

// BackwardLosses is Backward that returns the data loss (without regularizers) next to the loss.
func (m *Model) BackwardLosses(batch Batch, scale float64) (BackwardResult, error) {
	return m.backward(batch, scale, false)
}

// BackwardOutputs is Backward that also returns the model's outputs for the batch and the TrainMetrics
// values, from the same forward pass.
func (m *Model) BackwardOutputs(batch Batch, scale float64) (BackwardResult, error) {
	return m.backward(batch, scale, true)
}

func (m *Model) backward(batch Batch, scale float64, withOutputs bool) (res BackwardResult, err error) {
	defer recovered("prepare: backward", &err)
	if err := m.rt.checkOpen("Backward"); err != nil {
		return res, err
	}
	if !m.materialized {
		if err := m.Materialize(batch); err != nil {
			return res, err
		}
	}
	if err := m.checkBatch(batch); err != nil {
		return res, err
	}
	if err := m.checkLabels(batch); err != nil {
		return res, err
	}
	steps, err := m.reducer.BeginMicroBatch()
	if err != nil {
		return res, err
	}
	defer m.rt.endPhase(m.rt.beginPhase(PhaseBackward, m.microSteps+1, steps))
	if steps && len(m.scheduleVars) > 0 {
		if err := m.keepScheduleValues(); err != nil {
			return res, err
		}
	}
	// ShardGradients hands a micro-batch that syncs straight after a step to the reduce-scatter without a
	// whole-model accumulator; any other micro-batch adds into the accumulators, made when first needed.
	emit := m.sharding.Stage() == 2 && steps && !m.reducer.Dirty()
	if !emit && m.buckets == nil {
		if _, err := m.makeAccumulators(); err != nil {
			return res, err
		}
		if err := m.reducer.SetAccumulators(m.buckets); err != nil {
			return res, err
		}
	}
	// Nothing accumulated since the last step or clear: the micro-step sets the accumulators (Reducer.Dirty);
	// one that adds into them needs the sums the last step applied cleared first.
	fresh := freshAccumulators && !emit && !m.reducer.Dirty()
	if !fresh && !emit {
		if err := m.reducer.ClearSpent(); err != nil {
			return res, err
		}
	}
	exec, err := m.exec(withOutputs, emit, fresh)
	if err != nil {
		return res, err
	}
	if m.rt.Overlap && !emit && m.reducer.ArmOverlap() {
		// The step may start buckets' all-reduces from inside itself; a step that fails before the sync
		// waits for them must still wait, for the engines write into its outputs until they complete.
		defer func() { _ = m.reducer.AbortOverlap() }()
	}
	tuner := m.rt.opsTuner()
	tuner.before()
	start := time.Now()
	pass := m.rt.beginPhase(PhaseForwardBackward, m.microSteps+1, steps)
	out, err := exec.Exec(m.microStepArgs(batch, scale, steps)...)
	m.rt.endPhase(pass)
	elapsed := time.Since(start)
	m.computeTime += elapsed
	if err != nil {
		return res, fmt.Errorf("prepare: training step: %w", err)
	}
	tuner.after(elapsed)
	if withOutputs {
		end := len(out)
		if emit {
			end -= len(m.plan.Buckets)
		}
		res.Outputs = out[2 : 2+m.numOutputs]
		if end > 2+m.numOutputs {
			res.Metrics = out[2+m.numOutputs : end]
		}
	}
	m.microSteps++
	if emit {
		if err := m.reducer.EmitGradients(out[len(out)-len(m.plan.Buckets):]); err != nil {
			return res, err
		}
	}
	res.Loss = tensors.ToScalar[float64](out[0])
	res.DataLoss = tensors.ToScalar[float64](out[1])
	if err := m.reducer.EndMicroBatch(scale, res.Loss); err != nil {
		return res, err
	}
	// Buffers follow the optimizer steps: the gradient sync a step follows syncs them too, whatever the
	// all-reduces in between (WithSyncEachBatch), so that every rank steps and evaluates with the same.
	// Under local SGD the replicas part between averages, and the buffers with them: they are averaged with
	// the parameters (Optimizer.Step).
	if steps && !m.rt.local() {
		return res, m.SyncBuffers(m.bufferSync)
	}
	return res, nil
}

// keepScheduleValues copies the schedule variables' values before the micro-batch that advances them, so
// that a skipped optimizer step can put them back.
func (m *Model) keepScheduleValues() error {
	m.scheduleBefore = m.scheduleBefore[:0]
	for _, v := range m.scheduleVars {
		t, err := v.Value()
		if err == nil {
			t, err = t.LocalClone()
		}
		if err != nil {
			return fmt.Errorf("prepare: schedule variable %q: %w", v.ScopeAndName(), err)
		}
		m.scheduleBefore = append(m.scheduleBefore, t)
	}
	return nil
}

// rewindSchedule undoes the schedule's advance of a step that was not applied.
func (m *Model) rewindSchedule() error {
	for i, t := range m.scheduleBefore {
		if err := m.scheduleVars[i].SetValue(t); err != nil {
			return fmt.Errorf("prepare: schedule variable %q: %w", m.scheduleVars[i].ScopeAndName(), err)
		}
	}
	m.scheduleBefore = m.scheduleBefore[:0]
	return nil
}

// Predict runs the model's forward graph (not in training mode) on inputs.
func (m *Model) Predict(inputs ...*tensors.Tensor) (out []*tensors.Tensor, err error) {
	defer recovered("prepare: predict", &err)
	if err := m.rt.checkOpen("Predict"); err != nil {
		return nil, err
	}
	if !m.materialized {
		return nil, errors.New("prepare: Predict before the model was built: run Backward or Materialize first")
	}
	if m.evalExec == nil {
		m.evalExec, err = context.NewExec(m.rt.Backend, m.ctx.Reuse(), func(ctx *context.Context, in []*Node) []*Node {
			ctx.SetTraining(in[0].Graph(), false)
			return m.modelFn(ctx, in)
		})
		if err != nil {
			return nil, err
		}
		m.evalExec.SetMaxCache(16)
	}
	args := make([]any, len(inputs))
	for i, t := range inputs {
		args[i] = t
	}
	return m.evalExec.Exec(args...)
}

// probeGraph builds a graph with parameters shaped like args and discards it: GoMLX creates variables
// while graphs are built, so this creates them (and lets us plan buckets) without executing anything.
func probeGraph(rt *Runtime, name string, args []any, build func(g *Graph, params []*Node)) {
	g := NewGraph(rt.Backend, name)
	defer g.Finalize()
	params := make([]*Node, len(args))
	for i, arg := range args {
		params[i] = Parameter(g, fmt.Sprintf("arg%d", i), arg.(*tensors.Tensor).Shape())
	}
	build(g, params)
}

func tensorShapes(ts []*tensors.Tensor) []shapes.Shape {
	s := make([]shapes.Shape, len(ts))
	for i, t := range ts {
		s[i] = t.Shape()
	}
	return s
}

// FromTrainModelFn adapts a GoMLX train.ModelFn — the model function GoMLX's Trainer takes, with its spec
// argument — so that an existing GoMLX model needs no rewrite. spec is passed to every call, as GoMLX's
// datasets pass the spec of their batches (nil for most models).
func FromTrainModelFn(fn train.ModelFn, spec any) ModelFn {
	if fn == nil {
		return nil
	}
	return func(ctx *context.Context, inputs []*Node) []*Node { return fn(ctx, spec, inputs) }
}

// Sharding is the strategy the model's gradients and optimizer state are split with (Replicated on one
// process; nil before the model is built).
func (m *Model) Sharding() accumulate.Sharding { return m.sharding }

// ZeroBatch is a batch of zeros shaped as the one the model was built with: what a process that has no
// batch of its own runs the model on when it must take part in a step with zero weight (the Accelerator's
// Join).
func (m *Model) ZeroBatch() (Batch, error) {
	if !m.materialized {
		return Batch{}, errors.New("prepare: the model has no shapes yet: run Backward or Materialize first")
	}
	var b Batch
	for _, s := range m.firstInputs {
		b.Inputs = append(b.Inputs, tensors.FromShape(s))
	}
	for _, s := range m.firstLabels {
		b.Labels = append(b.Labels, tensors.FromShape(s))
	}
	return b, nil
}
