package prepare

import (
	"fmt"

	"github.com/goaccel/goaccel/internal/replicas"
)

// OptimizerState is what a checkpoint keeps of a prepared optimizer besides its variables.
type OptimizerState struct {
	// Steps and Skipped count the applied steps and those the NonFiniteSkip policy skipped.
	Steps, Skipped int64
	// Kind is the GoMLX optimizer's Go type: another optimizer's state must not be loaded into this one.
	Kind string
}

// State returns the optimizer's counters and kind, for a checkpoint.
func (o *Optimizer) State() OptimizerState {
	return OptimizerState{Steps: o.steps, Skipped: o.skippedSteps, Kind: fmt.Sprintf("%T", o.optimizer)}
}

// Restore sets the optimizer's counters from a checkpoint. A state of another kind of optimizer is refused
// (an empty Kind, from a checkpoint that did not record it, is accepted).
func (o *Optimizer) Restore(s OptimizerState) error {
	if kind := o.State().Kind; s.Kind != "" && s.Kind != kind {
		return fmt.Errorf("prepare: optimizer state of a %s cannot be restored into a %s", s.Kind, kind)
	}
	if s.Steps < 0 || s.Skipped < 0 {
		return fmt.Errorf("prepare: optimizer state has negative step counts (%d applied, %d skipped)", s.Steps, s.Skipped)
	}
	o.steps, o.skippedSteps = s.Steps, s.Skipped
	return nil
}

// Describe renders the optimizer's whole configuration (type, hyperparameters, clipping, non-finite
// policy), which every rank of a job must share.
func (o *Optimizer) Describe() string {
	return fmt.Sprintf("%s, gradient clipping norm %g, non-finite policy %v", replicas.Describe(o.optimizer),
		o.clipNorm, o.nonFinite)
}

// LoaderState is a data loader's place in its data: the epoch and the number of batches of it consumed.
type LoaderState struct {
	Epoch, Position int
}

// State returns the loader's place, for a checkpoint.
func (l *DataLoader) State() LoaderState { return LoaderState{Epoch: l.epoch, Position: l.position} }

// Restore makes the next iteration yield s.Epoch's batches from batch s.Position on, skipping the batches
// consumed before the checkpoint without computing them.
func (l *DataLoader) Restore(s LoaderState) error {
	if err := l.CheckRestore(s); err != nil {
		return err
	}
	return l.restore(s.Epoch, s.Position)
}

// CheckRestore returns the error Restore would return for s, without changing anything.
func (l *DataLoader) CheckRestore(s LoaderState) error {
	if s.Epoch < 0 {
		return fmt.Errorf("prepare: cannot resume in epoch %d: epochs count from 0", s.Epoch)
	}
	if s.Position < 0 {
		return fmt.Errorf("prepare: cannot resume at batch %d: positions count batches from 0", s.Position)
	}
	if l.source != nil && s.Position > l.Len() {
		return fmt.Errorf("prepare: cannot resume at batch %d of an epoch of %d batches", s.Position, l.Len())
	}
	return nil
}

// Peekable reports whether PeekBatch works: the loader has an indexable source, not a stream.
func (l *DataLoader) Peekable() bool { return l.source != nil }
