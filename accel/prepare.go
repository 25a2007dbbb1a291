package accel

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/prepare"
	"github.com/goaccel/goaccel/schedule"
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
	// SizedSchedule, instead of Schedule, is a schedule that needs the job's length (schedule.Cosine,
	// schedule.Linear). Prepare sizes it in examples once the loaders are prepared — Epochs × the first
	// loader's dataset, with this run's examples per optimizer step for a warm-up given in steps — and each
	// optimizer step gets the rate at the examples the job had seen before it, which the first loader's
	// place (kept in checkpoints) gives: a job resumed with another global batch carries on from the
	// share of the job it had done (docs/semantics.md, section 2). On a run that keeps its global batch
	// and whole epochs these are the rates of a schedule sized with Epochs × OptimizerStepsPerEpoch.
	SizedSchedule schedule.Sized
	// Epochs is the number of epochs the job trains for, which sizes SizedSchedule.
	Epochs int
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
	Scheduler *prepare.Scheduler // nil without Spec.Schedule or Spec.SizedSchedule
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
	case (spec.Schedule != nil || spec.SizedSchedule != nil) && spec.Optimizer == nil:
		return p, errors.New("accel: prepare: a schedule needs an optimizer")
	case spec.Schedule != nil && spec.SizedSchedule != nil:
		return p, errors.New("accel: prepare: give Schedule or SizedSchedule, not both")
	case spec.SizedSchedule != nil && spec.Epochs < 1:
		return p, fmt.Errorf("accel: prepare: SizedSchedule needs the number of epochs (Spec.Epochs), got %d", spec.Epochs)
	case spec.SizedSchedule != nil && len(spec.Loaders) == 0:
		return p, errors.New("accel: prepare: SizedSchedule needs a loader to count the optimizer steps of an epoch")
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
	optimizerOptions := spec.OptimizerOptions
	var job *jobSchedule
	if spec.SizedSchedule != nil {
		job = a.newJobSchedule(spec.SizedSchedule, spec.Epochs)
		optimizerOptions = append(slices.Clip(optimizerOptions), prepare.AfterStep(job.afterStep))
	}
	if spec.Optimizer != nil {
		if p.Optimizer, err = a.PrepareOptimizer(p.Model, spec.Optimizer, optimizerOptions...); err != nil {
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
	if job != nil {
		if p.Scheduler, err = job.prepare(p.Optimizer, p.Loaders[0]); err != nil {
			return p, err
		}
	}
	return p, nil
}

// OptimizerStepsPerEpoch is the number of optimizer steps one epoch of loader makes on this job: its
// batches per process (the dataset sharded across the processes, split or not) over the gradient
// accumulation steps K, rounded up, since Accumulate steps on the loader's last batch even when the epoch
// is not a multiple of K. Every process gets the same number. A stream's length is unknown: an error.
func (a *Accelerator) OptimizerStepsPerEpoch(loader *prepare.DataLoader) (int64, error) {
	batches := loader.Len()
	if batches < 0 {
		return 0, errors.New("accel: a streamed dataset has no known number of batches per epoch")
	}
	k := a.state.Steps()
	return int64((batches + k - 1) / k), nil
}
