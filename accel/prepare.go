package accel

import (
	"errors"
	"fmt"

	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/prepare"
)

// Spec names everything a training loop prepares: one model, and optionally its optimizer, a learning-rate
// schedule and data loaders. Prepare turns it into the prepared objects in one call.
type Spec struct {
	// Context holds (or will hold) the model's variables; nil means a new one.
	Context *context.Context
	// Model builds predictions and Loss a scalar loss (see PrepareModel). A GoMLX train.ModelFn fits
	// through prepare.FromTrainModelFn.
	Model        prepare.ModelFn
	Loss         prepare.LossFn
	ModelOptions []prepare.ModelOption
	// Optimizer, when not nil, is prepared for the model with OptimizerOptions.
	Optimizer        optimizers.Interface
	OptimizerOptions []prepare.OptimizerOption
	// Schedule, when not nil, drives the optimizer's learning rate (see PrepareScheduler).
	Schedule prepare.Schedule
	// Loaders are prepared in order.
	Loaders []LoaderSpec
}

// LoaderSpec is one data loader of a Spec: an indexable source and the loader's options (see
// PrepareDataLoader).
type LoaderSpec struct {
	Source  prepare.Source
	Options []prepare.LoaderOption
}

// Prepared are the objects Prepare made, in the Spec's order.
type Prepared struct {
	Model     *prepare.Model
	Optimizer *prepare.Optimizer // nil without Spec.Optimizer
	Scheduler *prepare.Scheduler // nil without Spec.Schedule
	Loaders   []*prepare.DataLoader
}

// Prepare prepares a Spec's model, optimizer, scheduler and loaders together, as Accelerate's
// accelerator.prepare does; it is PrepareModel, PrepareOptimizer, PrepareScheduler and PrepareDataLoader in
// one call, which stay available one by one. The Spec is checked whole before anything is prepared.
func (a *Accelerator) Prepare(spec Spec) (Prepared, error) {
	var p Prepared
	if err := a.checkOpen(); err != nil {
		return p, err
	}
	switch {
	case spec.Model == nil:
		return p, errors.New("accel: prepare: the spec has no model function")
	case spec.Loss == nil:
		return p, errors.New("accel: prepare: the spec has no loss function")
	case spec.Schedule != nil && spec.Optimizer == nil:
		return p, errors.New("accel: prepare: a schedule needs an optimizer")
	}
	for i, l := range spec.Loaders {
		if l.Source == nil {
			return p, fmt.Errorf("accel: prepare: loader %d has no source", i)
		}
	}
	ctx := spec.Context
	if ctx == nil {
		ctx = context.New()
	}
	var err error
	if p.Model, err = a.PrepareModel(ctx, spec.Model, spec.Loss, spec.ModelOptions...); err != nil {
		return p, err
	}
	if spec.Optimizer != nil {
		if p.Optimizer, err = a.PrepareOptimizer(p.Model, spec.Optimizer, spec.OptimizerOptions...); err != nil {
			return p, err
		}
	}
	if spec.Schedule != nil {
		if p.Scheduler, err = a.PrepareScheduler(p.Optimizer, spec.Schedule); err != nil {
			return p, err
		}
	}
	for i, l := range spec.Loaders {
		loader, err := a.PrepareDataLoader(l.Source, l.Options...)
		if err != nil {
			return p, fmt.Errorf("accel: prepare: loader %d: %w", i, err)
		}
		p.Loaders = append(p.Loaders, loader)
	}
	return p, nil
}
