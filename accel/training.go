package accel

import (
	"errors"
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/prepare"
)

// PrepareModel wraps a GoMLX model: ctx holds (or will hold) its variables, modelFn builds predictions and
// lossFn a scalar loss. The variables are created, or taken from ctx if it already has them, on the first
// Backward; replicas are then made identical to rank 0's. Options add in-graph training metrics
// (prepare.TrainMetrics) that Backward returns through Metrics. The model's buffers (batch normalisation's
// moving averages) are synchronised as WithBufferSync says, unless an option (prepare.BufferSyncMode) says
// otherwise for this model.
func (a *Accelerator) PrepareModel(ctx *context.Context, modelFn prepare.ModelFn, lossFn prepare.LossFn,
	opts ...prepare.ModelOption) (*prepare.Model, error) {
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	opts = append([]prepare.ModelOption{prepare.BufferSyncMode(a.cfg.bufferSync)}, opts...)
	m, err := prepare.NewModel(a.rt, ctx, modelFn, lossFn, opts...)
	if err != nil {
		return nil, err
	}
	if err := a.seedContext(ctx); err != nil {
		return nil, err
	}
	a.models = append(a.models, m)
	return m, nil
}

// PrepareOptimizer wraps a GoMLX optimizer (one with UpdateGraphWithGradients, such as SGD or Adam) for
// model. Its Step applies gradients only on steps that synced.
func (a *Accelerator) PrepareOptimizer(model *prepare.Model, opt optimizers.Interface, opts ...prepare.OptimizerOption) (*prepare.Optimizer, error) {
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	var o *prepare.Optimizer
	if a.cfg.checkReplicas {
		opts = append(opts, prepare.AfterStep(func() error {
			// Under local SGD the replicas are the same right after an average only.
			if o.LocalStepsSinceAverage() != 0 {
				return nil
			}
			return replicas.CheckReplicasInSync(a.comm, a.sharedVariables(model))
		}))
	}
	o, err := prepare.NewOptimizer(model, opt, opts...)
	if err != nil {
		return nil, err
	}
	a.optimizers = append(a.optimizers, o)
	return o, nil
}

// PrepareDataLoader shards an indexable source across ranks; the batch size is per rank, or global with
// WithSplitBatches.
func (a *Accelerator) PrepareDataLoader(source prepare.Source, opts ...prepare.LoaderOption) (*prepare.DataLoader, error) {
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	opts = append([]prepare.LoaderOption{prepare.Seed(a.cfg.seed)}, opts...)
	if a.cfg.splitBatches {
		opts = append(opts, prepare.SplitBatches())
	}
	if a.timeline != nil {
		source = a.rt.ObserveSource(source)
	}
	l, err := prepare.NewDataLoader(a.rt, source, opts...)
	if err != nil {
		return nil, err
	}
	a.loaders = append(a.loaders, l)
	return l, nil
}

// PrepareDataset shards a GoMLX train.Dataset (a stream of batches) across ranks by taking every N-th batch.
// Every process reads the whole stream; with DispatchBatches the main process alone reads it and sends
// each process its batch, and the others may pass a nil dataset.
func (a *Accelerator) PrepareDataset(ds train.Dataset, opts ...prepare.LoaderOption) (*prepare.DataLoader, error) {
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	l, err := prepare.NewStreamLoader(a.rt, ds, opts...)
	if err != nil {
		return nil, err
	}
	a.loaders = append(a.loaders, l)
	return l, nil
}

// BackwardOption configures one Backward call.
type BackwardOption func(*backwardConfig)

type backwardConfig struct {
	lossScale        float64
	outputs, metrics *[]*tensors.Tensor
	dataLoss         *float64
}

// DataLoss stores in *dst the loss function's value for the batch without the terms the model added with
// train.AddLoss (regularizers such as L2), which the loss Backward returns includes: what to log to
// compare runs with other regularization.
func DataLoss(dst *float64) BackwardOption {
	return func(c *backwardConfig) { c.dataLoss = dst }
}

// Outputs stores the model's outputs (predictions, computed in training mode) for the batch in *dst, from
// the same forward pass as the gradients: training accuracy needs no second forward.
func Outputs(dst *[]*tensors.Tensor) BackwardOption {
	return func(c *backwardConfig) { c.outputs = dst }
}

// Metrics stores the values of the model's in-graph training metrics (prepare.TrainMetrics) for the batch
// in *dst; nil when the model has none.
func Metrics(dst *[]*tensors.Tensor) BackwardOption {
	return func(c *backwardConfig) { c.metrics = dst }
}

// LossScale multiplies this micro-batch's loss (and so its gradients) by s, on top of the 1/K that
// Accumulate applies. The manual NoSync pattern uses it to average K micro-batches: LossScale(1.0/K).
func LossScale(s float64) BackwardOption { return func(c *backwardConfig) { c.lossScale = s } }

// Backward runs the forward and backward pass of model on batch and adds the gradients to the model's
// accumulators; on steps that sync it also all-reduces them. It returns this rank's loss for the batch,
// including the terms the model added with train.AddLoss (regularizers), which are optimised too.
func (a *Accelerator) Backward(model *prepare.Model, batch prepare.Batch, opts ...BackwardOption) (float64, error) {
	if err := a.checkModel(model); err != nil {
		return 0, err
	}
	if err := checkBatch(batch); err != nil {
		return 0, err
	}
	if err := a.agreeOnSettings(); err != nil {
		return 0, err
	}
	cfg := backwardConfig{lossScale: 1}
	for _, opt := range opts {
		opt(&cfg)
	}
	scale := a.state.MicroBatchScale() * cfg.lossScale
	afterSync := func() error { return nil }
	if a.join != nil && a.join.model == model {
		var err error
		if scale, afterSync, err = a.joinBackward(batch, cfg.lossScale); err != nil {
			return 0, err
		}
	}
	if cfg.outputs == nil && cfg.metrics == nil && cfg.dataLoss == nil {
		loss, err := model.Backward(batch, scale)
		if err != nil {
			return loss, err
		}
		return loss, afterSync()
	}
	var res prepare.BackwardResult
	var err error
	if cfg.outputs == nil && cfg.metrics == nil {
		res, err = model.BackwardLosses(batch, scale)
	} else {
		res, err = model.BackwardOutputs(batch, scale)
	}
	if cfg.dataLoss != nil {
		*cfg.dataLoss = res.DataLoss
	}
	if cfg.outputs != nil {
		*cfg.outputs = res.Outputs
	}
	if cfg.metrics != nil {
		*cfg.metrics = res.Metrics
	}
	if err != nil {
		return res.Loss, err
	}
	return res.Loss, afterSync()
}

// checkBatch refuses nil tensors in a batch, which the model would otherwise dereference.
func checkBatch(batch prepare.Batch) error {
	for i, t := range batch.Inputs {
		if t == nil {
			return fmt.Errorf("accel: backward: batch input #%d is nil", i)
		}
	}
	for i, t := range batch.Labels {
		if t == nil {
			return fmt.Errorf("accel: backward: batch label #%d is nil", i)
		}
	}
	return nil
}

func (a *Accelerator) checkModel(model *prepare.Model) error {
	if err := a.checkOpen(); err != nil {
		return err
	}
	if model == nil {
		return errors.New("accel: model is nil")
	}
	for _, m := range a.models {
		if m == model {
			return nil
		}
	}
	return errors.New("accel: model was not prepared by this accelerator: call PrepareModel first")
}

// Accumulate runs fn as one micro-batch of gradient accumulation: Backward inside it scales gradients by
// 1/K, and syncs only on every K-th call or on the data loader's last batch (with WithSyncEachBatch it also
// all-reduces on the other calls, without stepping). The optimizer's Step and ZeroGrad do nothing on calls
// that did not sync, so the loop body stays the same as without accumulation.
//
// The gradient state is the accelerator's, shared by every model it prepared (as in Accelerate): the
// cycle applies to all of them.
func (a *Accelerator) Accumulate(fn func() error) error {
	if err := a.checkFn(fn); err != nil {
		return err
	}
	return a.state.Accumulate(fn)
}

// NoSync runs fn without gradient synchronisation: Backward inside it only accumulates locally, and the
// first Backward outside it syncs everything accumulated.
func (a *Accelerator) NoSync(fn func() error) error {
	if err := a.checkFn(fn); err != nil {
		return err
	}
	return a.state.NoSync(fn)
}

func (a *Accelerator) checkFn(fn func() error) error {
	if err := a.checkOpen(); err != nil {
		return err
	}
	if fn == nil {
		return errors.New("accel: nil function")
	}
	return nil
}

// SyncGradients reports whether the current step synchronises gradients: inside Accumulate, whether this
// is the step the optimizer will apply.
func (a *Accelerator) SyncGradients() bool { return a.state.SyncGradients() }

// CheckReplicas verifies that every rank holds bitwise-identical weights for model, returning an error that
// names the first divergent variable. The weights include the optimizer's state and the model's buffers
// (identical after each optimizer step; left out with NoBufferSync), not the per-process generator state.
// Under local SGD (WithLocalSGD, WithDiLoCo) they are the parameters and buffers alone, identical right
// after each average (the optimizer state is each process's own). Collective.
func (a *Accelerator) CheckReplicas(model *prepare.Model) error {
	if err := a.checkModel(model); err != nil {
		return err
	}
	if !model.Materialized() {
		return fmt.Errorf("accel: model has no weights yet")
	}
	return replicas.CheckReplicasInSync(a.comm, a.sharedVariables(model))
}

// sharedVariables are the variables of model that every process holds identically: the replicated ones,
// and under local SGD, whose optimizer state is each process's own, the parameters and buffers that the
// averages make identical (right after each average).
func (a *Accelerator) sharedVariables(model *prepare.Model) []*context.Variable {
	if a.rt.LocalSGD == nil {
		return model.ReplicatedVariables()
	}
	return append(model.Parameters(), model.Buffers()...)
}

// Models are the models prepared so far, in order.
func (a *Accelerator) Models() []*prepare.Model { return append([]*prepare.Model(nil), a.models...) }

// Optimizers are the optimizers prepared so far, in order.
func (a *Accelerator) Optimizers() []*prepare.Optimizer {
	return append([]*prepare.Optimizer(nil), a.optimizers...)
}

// seedContext makes GoMLX's random initialisation (and dropout) reproducible from the accelerator's seed,
// unless the user already chose: a seeded RNG state, or the initializers_seed hyperparameter. Rank 0's
// weights are broadcast anyway; the seed is what makes two runs of the same program start alike, which
// exact resumption and run-to-run comparisons rely on.
func (a *Accelerator) seedContext(ctx *context.Context) error {
	if v := ctx.GetVariableByScopeAndName(context.RootScope, context.RNGStateVariableName); v != nil && v.HasValue() {
		return nil
	}
	if _, found := ctx.GetParam(context.ParamInitialSeed); found {
		return nil
	}
	if err := ctx.SetRNGStateFromSeed(int64(a.cfg.seed)); err != nil {
		return fmt.Errorf("accel: seeding the model's random number generator: %w", err)
	}
	return nil
}
