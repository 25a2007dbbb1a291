package testmodel

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers/regularizers"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/prepare"
)

// Run is one training run of the test MLP through an Accelerator.
type Run struct {
	Kind           OptimizerKind
	Inputs, Labels *tensors.Tensor
	BatchSize      int // per rank
	Epochs         int
	// ManualK, when > 0, uses the manual pattern instead of Accumulate: NoSync for ManualK-1 micro-batches
	// with LossScale(1/ManualK), then a syncing Backward.
	ManualK int
	// AfterStep, if set, runs after each applied optimizer step.
	AfterStep func(step int64) error
	// LossFn replaces Loss, and LossScale (when non-zero) is passed to every Backward.
	LossFn    prepare.LossFn
	LossScale float64
	// L2, when non-zero, sets GoMLX's regularizers.ParamL2 hyperparameter: layers.Dense then adds an L2
	// term on its weights with train.AddLoss.
	L2 float64
}

// Result is what a run leaves behind.
type Result struct {
	// Initial holds the parameters as they were before the first step (after rank 0's were broadcast).
	Initial   *context.Context
	Model     *prepare.Model
	Optimizer *prepare.Optimizer
	Losses    []float64
	Steps     int64
}

// Train runs the loop a user would write.
func (r Run) Train(acc *accel.Accelerator) (Result, error) {
	ctx := context.New()
	if r.L2 != 0 {
		ctx.SetParam(regularizers.ParamL2, r.L2)
	}
	lossFn := r.LossFn
	if lossFn == nil {
		lossFn = Loss
	}
	model, err := acc.PrepareModel(ctx, MLP, lossFn)
	if err != nil {
		return Result{}, err
	}
	opt, err := acc.PrepareOptimizer(model, NewOptimizer(r.Kind))
	if err != nil {
		return Result{}, err
	}
	src, err := prepare.TensorSource([]*tensors.Tensor{r.Inputs}, []*tensors.Tensor{r.Labels})
	if err != nil {
		return Result{}, err
	}
	loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(r.BatchSize))
	if err != nil {
		return Result{}, err
	}
	first, err := loader.PeekBatch()
	if err != nil {
		return Result{}, err
	}
	if err := model.Materialize(first); err != nil {
		return Result{}, err
	}
	res := Result{Model: model, Optimizer: opt, Initial: context.New()}
	if err := CopyParams(res.Initial, model.Parameters()); err != nil {
		return Result{}, err
	}
	step := func() error {
		stepped, err := opt.Step()
		if err != nil {
			return err
		}
		if err := opt.ZeroGrad(); err != nil {
			return err
		}
		if stepped && r.AfterStep != nil {
			return r.AfterStep(opt.Steps())
		}
		return nil
	}
	for epoch := range max(r.Epochs, 1) {
		loader.SetEpoch(epoch)
		i := 0
		for batch, err := range loader.All() {
			if err != nil {
				return res, err
			}
			if r.ManualK > 0 {
				scale := accel.LossScale(1 / float64(r.ManualK))
				if (i+1)%r.ManualK != 0 {
					err = acc.NoSync(func() error {
						loss, err := acc.Backward(model, batch, scale)
						res.Losses = append(res.Losses, loss)
						return err
					})
				} else {
					var loss float64
					loss, err = acc.Backward(model, batch, scale)
					res.Losses = append(res.Losses, loss)
					if err == nil {
						err = step()
					}
				}
			} else {
				err = acc.Accumulate(func() error {
					var opts []accel.BackwardOption
					if r.LossScale != 0 {
						opts = append(opts, accel.LossScale(r.LossScale))
					}
					loss, err := acc.Backward(model, batch, opts...)
					res.Losses = append(res.Losses, loss)
					if err != nil {
						return err
					}
					return step()
				})
			}
			if err != nil {
				return res, fmt.Errorf("epoch %d batch %d: %w", epoch, i, err)
			}
			i++
		}
	}
	res.Steps = opt.Steps()
	return res, nil
}

// ReferenceBatches cuts inputs and labels into consecutive batches of globalBatch examples, the batches
// one process would take to match a run of N ranks × K micro-batches × b (globalBatch = N·K·b), for the
// given number of epochs.
func ReferenceBatches(inputs, labels *tensors.Tensor, globalBatch, epochs int) [][2]*tensors.Tensor {
	n := inputs.Shape().Dimensions[0]
	var batches [][2]*tensors.Tensor
	for range max(epochs, 1) {
		for from := 0; from+globalBatch <= n; from += globalBatch {
			batches = append(batches, [2]*tensors.Tensor{Rows(inputs, from, from+globalBatch), Rows(labels, from, from+globalBatch)})
		}
	}
	return batches
}
