// Package resume reaches into prepared objects for checkpoints: the per-rank gradient accumulators, the
// counters and positions a resumed run must continue from. Only the Accelerator's SaveState/LoadState need
// them, so they stay out of package prepare's public API; prepare installs the hooks when it initialises.
//
// The hooks take the prepared objects as `any` because prepare imports this package (it installs the
// hooks), so this package cannot name prepare's types. Each hook panics on an object of the wrong type: a
// programming error inside goaccel, never a user's.
package resume

import "github.com/gomlx/gomlx/pkg/ml/context"

// ModelHooks reach into a *prepare.Model.
type ModelHooks struct {
	// Accumulators are the bucket accumulator variables, one per bucket (valid once materialised). They are
	// per-rank: a checkpoint taken mid-cycle must keep every rank's.
	Accumulators func(model any) []*context.Variable
	// PendingSync reports whether gradients were all-reduced but not yet applied by the optimizer.
	PendingSync func(model any) bool
	// RestoreAccumulation marks the accumulators as holding restored partial sums (or not).
	RestoreAccumulation func(model any, accumulating bool)
}

// OptimizerHooks reach into a *prepare.Optimizer.
type OptimizerHooks struct {
	// Restore sets the applied and skipped step counters.
	Restore func(optimizer any, steps, skipped int64)
	// Kind names the GoMLX optimizer's type, which a checkpoint records: another optimizer's state must not
	// be loaded into this one.
	Kind func(optimizer any) string
	// Describe renders the optimizer's whole configuration (type, hyperparameters, clipping, non-finite
	// policy) for comparison across ranks.
	Describe func(optimizer any) string
}

// LoaderHooks reach into a *prepare.DataLoader.
type LoaderHooks struct {
	// Restore makes the next iteration yield epoch's batches from batch position on, skipping the batches
	// consumed before the checkpoint without computing them.
	Restore func(loader any, epoch, position int) error
	// Peekable reports whether the loader's PeekBatch works (it has an indexable source).
	Peekable func(loader any) bool
	// CheckRestore returns the error Restore would return, without changing anything.
	CheckRestore func(loader any, epoch, position int) error
}

// The hooks, installed by package prepare's init.
var (
	Model     ModelHooks
	Optimizer OptimizerHooks
	Loader    LoaderHooks
)
