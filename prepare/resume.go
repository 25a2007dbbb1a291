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

// LoaderState is a data loader's place in its data: the epoch, and how much of the epoch's global order the
// job consumed. With strided sharding (rank r takes positions r, r+N, r+2N… of the epoch's permutation) the
// first m batches of N ranks are exactly the first N·m·b positions, so the place does not depend on the
// number of ranks: a state saved by N ranks resumes on any other number, each rank r' taking positions
// Consumed + r', Consumed + r' + N'… of the same order.
type LoaderState struct {
	Epoch int
	// Consumed counts the examples at the head of the epoch's order (for a stream, its batches) that the
	// job consumed, every rank's together.
	Consumed int
}

// State returns the loader's place, for a checkpoint. After the epoch's last batch it is the start of the
// next epoch, so that a job saved at the end of an epoch resumes with the next one whether or not the
// program called SetEpoch before saving.
func (l *DataLoader) State() LoaderState {
	switch {
	case l.pending():
		return LoaderState{Epoch: l.epoch, Consumed: l.start}
	case l.finished:
		return LoaderState{Epoch: l.iterEpoch + 1}
	}
	return LoaderState{Epoch: l.iterEpoch, Consumed: l.consumed()}
}

// StateAfterBatches is the state of this loader after every rank yielded batches batches of epoch: how a
// per-rank batch count (the position older checkpoints recorded) reads as a place in the epoch's order. It
// takes this loader's world size and batch size for the saving run's.
func (l *DataLoader) StateAfterBatches(epoch, batches int) (LoaderState, error) {
	if batches < 0 {
		return LoaderState{}, fmt.Errorf("prepare: cannot resume at batch %d: positions count batches from 0", batches)
	}
	if l.stream != nil {
		return LoaderState{Epoch: epoch, Consumed: batches * l.rt.Comm.Size()}, nil
	}
	if batches > l.Len() {
		return LoaderState{}, fmt.Errorf("prepare: cannot resume at batch %d of an epoch of %d batches", batches, l.Len())
	}
	if batches == l.Len() {
		return LoaderState{Epoch: epoch + 1}, nil
	}
	return LoaderState{Epoch: epoch, Consumed: batches * l.rt.Comm.Size() * l.cfg.batchSize}, nil
}

// Restore makes the next iteration yield the rest of s.Epoch's order, from position s.Consumed on, skipping
// what the job consumed before the checkpoint without computing it. On a world size or batch size other
// than the saving run's, the rest is sharded, padded (even batches) or cut (drop-last) as a fresh epoch of
// that many examples would be on this run's ranks. An epoch whose rest fills no batch here resumes at the
// start of the next one.
func (l *DataLoader) Restore(s LoaderState) error {
	if err := l.CheckRestore(s); err != nil {
		return err
	}
	l.restore(s.Epoch, s.Consumed)
	return nil
}

// CheckRestore returns the error Restore would return for s, without changing anything.
func (l *DataLoader) CheckRestore(s LoaderState) error {
	if s.Epoch < 0 {
		return fmt.Errorf("prepare: cannot resume in epoch %d: epochs count from 0", s.Epoch)
	}
	if s.Consumed < 0 {
		return fmt.Errorf("prepare: cannot resume after %d consumed examples: the count starts at 0", s.Consumed)
	}
	if l.source != nil && s.Consumed > l.source.Len() {
		return fmt.Errorf("prepare: cannot resume after %d consumed examples of an epoch of %d", s.Consumed,
			l.source.Len())
	}
	return nil
}

// Peekable reports whether PeekBatch works: the loader has an indexable source, not a stream.
func (l *DataLoader) Peekable() bool { return l.source != nil }
