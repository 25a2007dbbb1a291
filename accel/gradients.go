package accel

import (
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/prepare"
)

// GradientState returns the gradient state the accelerator's models, optimizers and data loaders share,
// as Accelerate's accelerator.gradient_state: inside Accumulate it describes the running micro-batch —
// whether it syncs and steps (SyncGradients), K and the place in the cycle (Steps, StepInCycle), and where
// the innermost data loader being iterated is (EndOfDataloader, Remainder; ActiveDataLoader gives the
// loader itself). It is the live state, not a copy: read it, and leave changing it to the Accelerator.
func (a *Accelerator) GradientState() *accumulate.GradientState { return a.state }

// ActiveDataLoader is the innermost prepared data loader being iterated, or nil.
func (a *Accelerator) ActiveDataLoader() *prepare.DataLoader {
	l, _ := a.state.ActiveLoader().(*prepare.DataLoader)
	return l
}

// ClipGradNorm clips model's synced gradients to a global L2 norm of at most maxNorm and returns their norm
// before clipping (Accelerate's clip_grad_norm_). Call it after a syncing Backward and before the
// optimizer's Step; on micro-batches that do not sync it does nothing and returns 0. Every rank clips the
// same averaged gradients, so no communication is needed.
func (a *Accelerator) ClipGradNorm(model *prepare.Model, maxNorm float64) (float64, error) {
	if err := a.checkModel(model); err != nil {
		return 0, err
	}
	return model.ClipGradNorm(maxNorm)
}

// ClipGradValue clamps model's synced gradients to [-clip, clip] (Accelerate's clip_grad_value_), under the
// same rules as ClipGradNorm.
func (a *Accelerator) ClipGradValue(model *prepare.Model, clip float64) error {
	if err := a.checkModel(model); err != nil {
		return err
	}
	return model.ClipGradValue(clip)
}

// PrepareScheduler drives opt's learning rate with schedule, which gives the rate of each optimizer step
// (counted from 0 over applied steps): it moves once per optimizer step, whatever K, never on a skipped
// step, and resumes with the checkpoint's step count. See prepare.Scheduler.
func (a *Accelerator) PrepareScheduler(opt *prepare.Optimizer, schedule prepare.Schedule) (*prepare.Scheduler, error) {
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	return prepare.NewScheduler(opt, schedule)
}
