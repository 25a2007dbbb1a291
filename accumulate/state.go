package accumulate

import (
	"errors"
	"fmt"
)

// GradientState decides, for each call of Backward, whether gradients are synchronised. One exists per
// Accelerator, shared by its models, optimizers and data loaders, as in Accelerate.
//
// The rules (docs/semantics.md §3): outside Accumulate and NoSync every Backward syncs. Inside NoSync nothing syncs.
// Inside Accumulate a call syncs when it is the K-th since the last sync, when the active data loader is
// yielding its last batch, or always when SyncEachBatch is set.
type GradientState struct {
	steps         int // K: micro-batches per optimizer step
	syncEachBatch bool

	inAccumulate bool
	noSyncDepth  int
	// stepInCycle counts Accumulate calls since the last sync.
	stepInCycle int
	// syncThisStep is the decision of the current Accumulate call.
	syncThisStep bool
	// endOfDataloader is set by a data loader while it yields its final batch.
	endOfDataloader bool

	// scaledMicroBatches counts micro-batches added with the 1/K scale since the last sync, and
	// unscaledMicroBatches those added with any other scale; together they let a short final cycle be
	// averaged over the micro-batches it really had.
	scaledMicroBatches   int
	unscaledMicroBatches int
}

// NewGradientState returns the state for K micro-batches per optimizer step.
func NewGradientState(steps int, syncEachBatch bool) (*GradientState, error) {
	if steps < 1 {
		return nil, fmt.Errorf("accumulate: gradient accumulation steps must be at least 1, got %d", steps)
	}
	return &GradientState{steps: steps, syncEachBatch: syncEachBatch}, nil
}

// Steps is K, the number of micro-batches per optimizer step.
func (s *GradientState) Steps() int { return s.steps }

// SyncEachBatch reports whether Accumulate syncs on every call.
func (s *GradientState) SyncEachBatch() bool { return s.syncEachBatch }

// InAccumulate reports whether an Accumulate call is running.
func (s *GradientState) InAccumulate() bool { return s.inAccumulate }

// SyncGradients reports whether the current Backward synchronises gradients (and so whether the optimizer
// step that follows applies them).
func (s *GradientState) SyncGradients() bool {
	if s.noSyncDepth > 0 {
		return false
	}
	if s.inAccumulate {
		return s.syncThisStep
	}
	return true
}

// StepInCycle is the number of Accumulate calls since the last sync.
func (s *GradientState) StepInCycle() int { return s.stepInCycle }

// SetEndOfDataloader is called by data loaders: true while the final batch is being processed.
func (s *GradientState) SetEndOfDataloader(end bool) { s.endOfDataloader = end }

// EndOfDataloader reports whether the active loader is at its last batch.
func (s *GradientState) EndOfDataloader() bool { return s.endOfDataloader }

// ErrNestedAccumulate is returned when Accumulate is called inside Accumulate.
var ErrNestedAccumulate = errors.New("accumulate: Accumulate called inside Accumulate; call it once per batch")

// Accumulate runs fn as one micro-batch of an accumulation cycle.
func (s *GradientState) Accumulate(fn func() error) error {
	if s.inAccumulate {
		return ErrNestedAccumulate
	}
	s.stepInCycle++
	s.syncThisStep = s.syncEachBatch || s.endOfDataloader || s.stepInCycle%s.steps == 0
	s.inAccumulate = true
	defer func() {
		s.inAccumulate = false
		if s.syncThisStep {
			s.stepInCycle = 0
		}
		s.syncThisStep = false
	}()
	return fn()
}

// NoSync runs fn with synchronisation off.
func (s *GradientState) NoSync(fn func() error) error {
	s.noSyncDepth++
	defer func() { s.noSyncDepth-- }()
	return fn()
}

// MicroBatchScale is the factor the next micro-batch's gradients are multiplied by before they are added
// to the accumulators: 1/K inside Accumulate, so that K micro-batches add up to their mean, else 1.
func (s *GradientState) MicroBatchScale() float64 {
	if s.inAccumulate {
		return 1 / float64(s.steps)
	}
	return 1
}

// RecordMicroBatch notes that a micro-batch was added with the given scale.
func (s *GradientState) RecordMicroBatch(scale float64) {
	if s.inAccumulate && scale == 1/float64(s.steps) {
		s.scaledMicroBatches++
	} else {
		s.unscaledMicroBatches++
	}
}

// SyncCorrection is the factor that turns the accumulated sum into the mean over micro-batches when a
// cycle ended early (the data loader ran out after m < K micro-batches, each scaled by 1/K): K/m. It is 1
// for full cycles and for gradients the user scaled themselves.
func (s *GradientState) SyncCorrection() float64 {
	m := s.scaledMicroBatches
	if s.unscaledMicroBatches > 0 || m == 0 || m >= s.steps {
		return 1
	}
	return float64(s.steps) / float64(m)
}

// MicroBatchesSinceSync is the number of micro-batches accumulated since the last sync.
func (s *GradientState) MicroBatchesSinceSync() int {
	return s.scaledMicroBatches + s.unscaledMicroBatches
}

// ResetMicroBatches starts a new accumulation: called when gradients were synced or cleared.
func (s *GradientState) ResetMicroBatches() {
	s.scaledMicroBatches, s.unscaledMicroBatches = 0, 0
}

// Position is the part of the state a checkpoint must restore to resume mid-cycle.
type Position struct {
	StepInCycle          int `json:"step_in_cycle"`
	ScaledMicroBatches   int `json:"scaled_micro_batches"`
	UnscaledMicroBatches int `json:"unscaled_micro_batches"`
}

// Position returns the resumable part of the state.
func (s *GradientState) Position() Position {
	return Position{StepInCycle: s.stepInCycle, ScaledMicroBatches: s.scaledMicroBatches,
		UnscaledMicroBatches: s.unscaledMicroBatches}
}

// Restore sets the resumable part of the state.
func (s *GradientState) Restore(p Position) error {
	if err := s.CheckPosition(p); err != nil {
		return err
	}
	s.stepInCycle, s.scaledMicroBatches, s.unscaledMicroBatches = p.StepInCycle, p.ScaledMicroBatches, p.UnscaledMicroBatches
	return nil
}

// CheckPosition returns the error Restore would return for p, without changing anything: a checkpoint is
// validated completely before any of it is applied.
func (s *GradientState) CheckPosition(p Position) error {
	if p.StepInCycle < 0 || p.StepInCycle >= s.steps || p.ScaledMicroBatches < 0 || p.UnscaledMicroBatches < 0 {
		return fmt.Errorf("accumulate: cannot restore position %+v with K=%d", p, s.steps)
	}
	return nil
}
