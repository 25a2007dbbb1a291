package prepare

import (
	"errors"
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
)

// Schedule gives the learning rate of optimizer step step, counted from 0 over applied steps.
type Schedule func(step int64) float64

// Scheduler drives an optimizer's learning rate from Go, as a scheduler prepared by Accelerate does: the
// rate of each step is set just before the step is applied. It counts applied optimizer steps, so it does
// not move on micro-batches that only accumulate, nor on steps skipped for non-finite gradients, and a
// resumed run continues where the saved one was (the step count is in the checkpoint).
//
// It sets GoMLX's learning-rate variable (optimizers.LearningRateVar), which SGD and Adam read; SGD's own
// decay, when on, still divides it by √step. Use either a Scheduler or a schedule in the model function
// (cosineschedule), not both: the Scheduler's rate would replace the other's.
type Scheduler struct {
	opt      *Optimizer
	schedule Schedule
	lrVar    *context.Variable
}

// NewScheduler attaches schedule to opt. An optimizer has at most one scheduler.
func NewScheduler(opt *Optimizer, schedule Schedule) (*Scheduler, error) {
	switch {
	case opt == nil:
		return nil, errors.New("prepare: scheduler needs a prepared optimizer")
	case schedule == nil:
		return nil, errors.New("prepare: schedule is nil")
	case opt.scheduler != nil:
		return nil, errors.New("prepare: the optimizer already has a scheduler")
	}
	s := &Scheduler{opt: opt, schedule: schedule}
	opt.scheduler = s
	opt.beforeStep = append(opt.beforeStep, s.set)
	return s, nil
}

// LearningRate is the rate the next optimizer step applies.
func (s *Scheduler) LearningRate() float64 { return s.schedule(s.opt.steps) }

// set writes the next step's rate into the optimizer's learning-rate variable.
func (s *Scheduler) set() error {
	if s.lrVar == nil {
		s.lrVar = s.opt.model.ctx.GetVariableByScopeAndName(
			context.RootScope+optimizers.Scope, optimizers.ParamLearningRate)
		if s.lrVar == nil {
			return fmt.Errorf("prepare: scheduler: the optimizer %T has no learning-rate variable %q",
				s.opt.optimizer, context.RootScope+optimizers.Scope+context.ScopeSeparator+optimizers.ParamLearningRate)
		}
	}
	lr := s.LearningRate()
	if err := s.lrVar.SetValue(tensors.FromAnyValue(shapes.CastAsDType(lr, s.lrVar.DType()))); err != nil {
		return fmt.Errorf("prepare: scheduler: setting the learning rate to %g: %w", lr, err)
	}
	return nil
}
