package accel

import (
	"github.com/goaccel/goaccel/prepare"
)

// GradientState is what the accelerator knows about the current micro-batch, as Accelerate's
// GradientState: whether it syncs and steps, and where the innermost data loader being iterated is.
type GradientState struct {
	// SyncGradients reports whether the current Backward syncs and the optimizer's Step applies.
	SyncGradients bool
	// EndOfDataloader reports whether the active loader is yielding its last batch of the epoch.
	EndOfDataloader bool
	// Remainder is the number of real examples in the active loader's last round of batches across all
	// ranks when that round is incomplete (dataset size mod global batch size), 0 when every round is full,
	// -1 when no loader is active or its length is unknown (a stream).
	Remainder int
	// ActiveDataLoader is the innermost data loader being iterated, or nil.
	ActiveDataLoader *prepare.DataLoader
	// Steps is K; StepInCycle counts the Accumulate calls since the last sync.
	Steps, StepInCycle int
	// SyncEachBatch reports whether every micro-batch is all-reduced (WithSyncEachBatch).
	SyncEachBatch bool
}

// GradientState returns the gradient state now: inside Accumulate it describes the running micro-batch.
func (a *Accelerator) GradientState() GradientState {
	gs := GradientState{SyncGradients: a.state.SyncGradients(), EndOfDataloader: a.state.EndOfDataloader(),
		Remainder: a.state.Remainder(), Steps: a.state.Steps(), StepInCycle: a.state.StepInCycle(),
		SyncEachBatch: a.state.SyncEachBatch()}
	gs.ActiveDataLoader, _ = a.state.ActiveLoader().(*prepare.DataLoader)
	return gs
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
