package accel

import (
	"errors"
	"fmt"

	"github.com/goaccel/goaccel/prepare"
	"github.com/goaccel/goaccel/schedule"
)

// jobSchedule drives a Spec's SizedSchedule by the job's data position rather than by optimizer steps: the
// schedule is sized with the job's examples (Spec.Epochs × the first loader's dataset) and each optimizer
// step gets the rate at the number of examples the job had seen when the step before it was applied — the
// job's start for the first step, the checkpoint's data position for the first step after a resume. That
// number is in checkpoints (the loaders' epoch and consumed examples, which do not depend on the number of
// processes), so a job resumed with another global batch carries on from the share of the job it had
// done, where a step count would be measured against a total sized for another global batch.
type jobSchedule struct {
	acc    *Accelerator
	sized  schedule.Sized
	epochs int

	opt    *prepare.Optimizer
	loader *prepare.DataLoader
	rate   prepare.Schedule // the sized schedule: examples seen → rate
	// examples is the dataset's length (an epoch), perBatch the examples of one batch of every process.
	examples, perBatch int64

	// known, steps and seen: the job had seen seen examples when its optimizer had applied steps steps.
	known bool
	steps int64
	seen  int64
}

func (a *Accelerator) newJobSchedule(sized schedule.Sized, epochs int) *jobSchedule {
	return &jobSchedule{acc: a, sized: sized, epochs: epochs}
}

// afterStep notes where the data stands after each applied optimizer step: where the next step begins. A
// step that drew nothing from the loader (another loader is iterated) would leave the schedule where it
// is for good: an error.
func (j *jobSchedule) afterStep() error {
	if j.loader == nil {
		return nil
	}
	now := j.position(j.loader.State())
	if j.known && now == j.seen && j.acc.ActiveDataLoader() != j.loader {
		return fmt.Errorf("accel: the schedule sized by the job (Spec.SizedSchedule) follows the examples the "+
			"first loader of the Spec yields, and optimizer step %d drew none from it: iterate that loader, or "+
			"put the training loader first in Spec.Loaders", j.opt.Steps())
	}
	j.note(j.opt.Steps(), now)
	return nil
}

// prepare sizes the schedule for loader's job and attaches it to opt.
func (j *jobSchedule) prepare(opt *prepare.Optimizer, loader *prepare.DataLoader) (*prepare.Scheduler, error) {
	n := loader.SourceLen()
	if n < 0 {
		return nil, errors.New("accel: prepare: sizing the schedule: a streamed dataset has no known number of " +
			"examples per epoch")
	}
	j.opt, j.loader = opt, loader
	j.examples = int64(n)
	j.perBatch = int64(j.acc.WorldSize() * loader.BatchSize())
	perStep := j.perBatch * int64(j.acc.state.Steps())
	j.rate = j.sized(int64(j.epochs)*j.examples, schedule.InExamples(perStep))
	if j.rate == nil {
		return nil, fmt.Errorf("accel: prepare: sizing the schedule: %T returned no schedule", j.sized)
	}
	return j.acc.PrepareScheduler(opt, j.schedule)
}

// schedule is the prepare.Schedule the Scheduler follows: the rate of optimizer step step.
func (j *jobSchedule) schedule(step int64) float64 { return j.rate(j.seenBefore(step)) }

// position is the number of the job's examples before state: its whole epochs and the consumed part of its
// epoch.
func (j *jobSchedule) position(state prepare.LoaderState) int64 {
	return int64(state.Epoch)*j.examples + int64(state.Consumed)
}

func (j *jobSchedule) note(steps, seen int64) { j.known, j.steps, j.seen = true, steps, seen }

// seenBefore is the number of examples the job had seen when the optimizer had applied step steps: where
// optimizer step number step begins.
func (j *jobSchedule) seenBefore(step int64) int64 {
	now := j.position(j.loader.State())
	if j.known && j.steps == step && j.seen <= now {
		return j.seen
	}
	// No step was applied since Prepare or LoadState. Outside the loader's loop (before it, as after a
	// LoadState, or between epochs) the loader's place is a step boundary.
	if j.acc.ActiveDataLoader() != j.loader {
		j.note(step, now)
		return now
	}
	// Inside the loop: the step is the first since the job started or resumed, and the micro-batches of its
	// cycle are already drawn.
	seen := j.cycleStart()
	j.note(step, seen)
	return seen
}

// cycleStart is the number of the job's examples before the current accumulation cycle, while the loader
// is yielding it: its m batches (of every process) are the last ones the loader yielded. The rank-wide
// state read here (the loader's place, the cycle's count, the remainder) is the same on every process.
func (j *jobSchedule) cycleStart() int64 {
	state := j.loader.State()
	m := int64(max(j.acc.state.StepInCycle(), 1)) // outside Accumulate every Backward is a cycle of its own
	if state.Consumed > 0 {
		return max(j.position(state)-m*j.perBatch, int64(state.Epoch)*j.examples)
	}
	// The cycle ended the epoch (the place is the next epoch's start): its last batch holds the remainder of
	// the epoch's last round, or a whole round.
	end := j.position(state)
	start := end - m*j.perBatch
	switch last := int64(j.acc.state.Remainder()); {
	case last > 0:
		start = end - last - (m-1)*j.perBatch
	case j.dropsLast():
		// Drop-last cut the epoch's incomplete last round (assuming the epoch started on a round boundary,
		// as it does unless the run resumed it with another global batch).
		start -= j.examples % j.perBatch
	}
	return max(start, end-j.examples)
}

// dropsLast reports whether the loader drops each epoch's incomplete last round: it yields fewer batches
// than whole ones would hold the dataset.
func (j *jobSchedule) dropsLast() bool {
	ranks, batch := int64(j.acc.WorldSize()), int64(j.loader.BatchSize())
	return int64(j.loader.Len()) < ((j.examples+ranks-1)/ranks+batch-1)/batch
}
