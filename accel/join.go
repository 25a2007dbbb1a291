package accel

import (
	"errors"
	"fmt"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/prepare"
)

// Join runs loop, the program's training loop over data that is not the same length on every process
// (a loader with EvenBatches(false), or a loop over each process's own files), and keeps this process in
// the others' gradient syncs once its loop has returned, as PyTorch's Join context does for DDP: until every
// process's loop has returned, a process that ran out of batches takes part in each optimizer step of the
// others with zero gradients, and applies the same update, so the replicas stay identical and nobody waits
// for a collective that never comes.
//
// Inside Join the synced gradient is the mean over the real examples of every process's micro-batches
// since the last step (a process's micro-batch counts as many examples as it has real ones), not the mean
// over processes: a process with a short last batch, or none, weighs what its examples weigh. Each
// optimizer step costs one more small all-reduce, of how many processes still have data and how many
// examples they used.
//
// loop must run the usual body — Backward (inside Accumulate or not), the optimizer's Step and ZeroGrad —
// for model and opt, and no collective of its own inside an optimizer step whose count differs between
// processes (a Gather of metrics per batch would wait for the joined processes, which do not run it):
// gather once after Join returns. Join is collective: every process calls it at the same point; it builds
// the model first if needed (from the first prepared data loader's first batch) and agrees on the settings,
// so that a process with no batch at all joins from the start. WithSyncEachBatch is refused. An error in
// one process's loop ends the job on every process (the others would wait for it).
func (a *Accelerator) Join(model *prepare.Model, opt *prepare.Optimizer, loop func() error) error {
	if err := a.checkModel(model); err != nil {
		return err
	}
	if loop == nil {
		return errors.New("accel: join: nil loop")
	}
	switch {
	case opt == nil || opt.Model() != model:
		return errors.New("accel: join: the optimizer must be the one prepared for model")
	case a.join != nil:
		return errors.New("accel: join: Join called inside Join")
	case a.rt.LocalSGD != nil:
		return fmt.Errorf("accel: join: %s steps on each process's own gradients, so a process out of data has "+
			"no step of the others to take part in; give every process the same number of batches (even "+
			"batches) instead", a.rt.LocalSGD)
	case a.state.SyncEachBatch():
		return errors.New("accel: join: sync-each-batch all-reduces every micro-batch, which a process out of " +
			"data cannot shadow; use Join without WithSyncEachBatch")
	}
	a.join = &joinState{model: model, opt: opt}
	defer func() { a.join = nil }()
	if !model.Materialized() {
		if err := a.materializeForLoad(); err != nil {
			return fmt.Errorf("accel: join: %w", err)
		}
	}
	if err := a.agreeOnSettings(); err != nil {
		return err
	}
	if err := loop(); err != nil {
		// The other processes wait for this one's next step: tell them it is gone rather than let them time
		// out.
		a.comm.Fail(err)
		return err
	}
	if a.state.MicroBatchesSinceSync() > 0 {
		return errors.New("accel: join: the loop returned with gradients accumulated since the last optimizer " +
			"step: end every accumulation cycle (the last batch of a prepared loader syncs)")
	}
	for {
		active, examples, err := a.joinHandshake(false, 0)
		if err != nil {
			return err
		}
		if active == 0 {
			return nil
		}
		if err := a.shadowStep(examples); err != nil {
			return fmt.Errorf("accel: join: shadowing an optimizer step of the other processes: %w", err)
		}
	}
}

// joinState is what Backward needs while a Join runs.
type joinState struct {
	model *prepare.Model
	opt   *prepare.Optimizer
	// examples counts this process's real examples since the last sync; last is its last batch, what a
	// shadow step runs the model on (with zero weight).
	examples int
	last     prepare.Batch
	seen     bool
}

// realExamples is the number of real examples in a batch: a prepared loader's padding is not.
func realExamples(b prepare.Batch) int {
	if b.ValidPerRank != nil {
		return b.Valid
	}
	return b.Size()
}

// joinHandshake all-reduces whether this process still has data and how many examples it used since the
// last sync: how many processes are active, and the examples the step's mean is over. Collective.
func (a *Accelerator) joinHandshake(active bool, examples int) (activeProcesses, totalExamples int, err error) {
	counts := []float64{0, float64(examples)}
	if active {
		counts[0] = 1
	}
	if a.WorldSize() > 1 {
		if err := a.comm.AllReduceSum(backends.BufferOf(counts)); err != nil {
			return 0, 0, fmt.Errorf("accel: join: %w", err)
		}
	}
	return int(counts[0]), int(counts[1]), nil
}

// joinBackward is Backward's part inside Join for the joined model: the micro-batch weighs its real
// examples, and on a micro-batch that syncs the processes first agree on the step's total. It returns the
// scale to run the micro-batch with and a function to call once it ran.
func (a *Accelerator) joinBackward(batch prepare.Batch, lossScale float64) (float64, func() error, error) {
	j := a.join
	n := realExamples(batch)
	j.examples += n
	j.last, j.seen = batch, true
	scale := float64(n) * lossScale
	if !a.state.SyncGradients() {
		return scale, func() error { return nil }, nil
	}
	_, total, err := a.joinHandshake(true, j.examples)
	if err != nil {
		return 0, nil, err
	}
	j.examples = 0
	return scale, func() error { return setJoinScale(j.model, total) }, nil
}

// setJoinScale makes the synced sums' average the mean over the step's examples.
func setJoinScale(m *prepare.Model, total int) error {
	if total <= 0 {
		return errors.New("accel: join: an optimizer step over no example (every batch was empty or padding)")
	}
	return m.Reducer().SetScale(1 / float64(total))
}

// shadowStep is a joined process's part of the others' optimizer step: a micro-batch of zero weight (the
// last batch it saw, or zeros shaped like the model's inputs), the sync, and the same update.
func (a *Accelerator) shadowStep(total int) error {
	j := a.join
	batch := j.last
	if !j.seen {
		var err error
		if batch, err = j.model.ZeroBatch(); err != nil {
			return err
		}
	}
	if _, err := j.model.Backward(batch, 0); err != nil {
		return err
	}
	if err := setJoinScale(j.model, total); err != nil {
		return err
	}
	if _, err := j.opt.Step(); err != nil {
		return err
	}
	return j.opt.ZeroGrad()
}
