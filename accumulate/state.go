package accumulate

import (
	"errors"
	"fmt"
)

// GradientState decides, for each call of Backward, whether gradients are synchronised. One exists per
// Accelerator, shared by its models, optimizers and data loaders, as in Accelerate.
//
// The rules (docs/semantics.md, "When gradients are synchronised"): outside Accumulate and NoSync every
// Backward syncs. Inside NoSync nothing syncs. Inside Accumulate a call syncs when it is the K-th since the
// last sync or when the active data loader is yielding its last batch. SyncEachBatch adds an all-reduce on
// every other Accumulate call too, without making it a step (the Reducer all-reduces it).
type GradientState struct {
	steps         int // K: micro-batches per optimizer step
	syncEachBatch bool

	inAccumulate bool
	noSyncDepth  int
	// stepInCycle counts Accumulate calls since the last sync.
	stepInCycle int
	// syncThisStep is the decision of the current Accumulate call.
	syncThisStep bool
	// loaders is the stack of data loaders being iterated, innermost last: an evaluation loop run inside
	// the training loop must not clear (or set) the training loader's end-of-dataloader flag.
	loaders []*loaderFrame
	// endOfDataloader is the flag SetEndOfDataloader sets while no loader is active.
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

// SyncEachBatch reports whether Accumulate all-reduces on every call (the optimizer still steps every K-th).
func (s *GradientState) SyncEachBatch() bool { return s.syncEachBatch }

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

// reduceThisStep reports whether the current Backward all-reduces gradients: on every step that syncs,
// and with SyncEachBatch on every Accumulate call outside NoSync, where the reduced micro-batch stays in the
// accumulators until the K-th call steps.
func (s *GradientState) reduceThisStep() bool {
	return s.SyncGradients() || (s.syncEachBatch && s.inAccumulate && s.noSyncDepth == 0)
}

// loaderFrame is one data loader being iterated.
// Loader is a data loader as the gradient state knows it while it is iterated (EnterLoader): prepare's
// DataLoader, or a loop's own.
type Loader interface {
	// Len is the number of batches the loader yields per epoch on this process.
	Len() int
}

type loaderFrame struct {
	owner     Loader
	end       bool
	remainder int
}

// EnterLoader records that owner (a data loader) starts iterating, with remainder as Remainder's value
// while it is the innermost. The returned function ends that iteration; loaders call it when their loop
// ends, broken out of or not. Loaders nest: the innermost one decides EndOfDataloader, and leaving it gives
// the decision back to the one outside it.
func (s *GradientState) EnterLoader(owner Loader, remainder int) (exit func()) {
	frame := &loaderFrame{owner: owner, remainder: remainder}
	s.loaders = append(s.loaders, frame)
	return func() {
		for i := len(s.loaders) - 1; i >= 0; i-- {
			if s.loaders[i] == frame {
				s.loaders = append(s.loaders[:i], s.loaders[i+1:]...)
				return
			}
		}
	}
}

// SetEndOfDataloader is called by data loaders: true while the final batch is being processed. It sets
// the innermost active loader's flag (a plain flag when no loader was entered).
func (s *GradientState) SetEndOfDataloader(end bool) {
	if n := len(s.loaders); n > 0 {
		s.loaders[n-1].end = end
		return
	}
	s.endOfDataloader = end
}

// EndOfDataloader reports whether the innermost active loader is at its last batch.
func (s *GradientState) EndOfDataloader() bool {
	if n := len(s.loaders); n > 0 {
		return s.loaders[n-1].end
	}
	return s.endOfDataloader
}

// ActiveLoader is the innermost data loader being iterated, or nil.
func (s *GradientState) ActiveLoader() Loader {
	if n := len(s.loaders); n > 0 {
		return s.loaders[n-1].owner
	}
	return nil
}

// Remainder is what the innermost active loader entered with (see EnterLoader), or -1 when none is
// active.
func (s *GradientState) Remainder() int {
	if n := len(s.loaders); n > 0 {
		return s.loaders[n-1].remainder
	}
	return -1
}

// ErrNestedAccumulate is returned when Accumulate is called inside Accumulate.
var ErrNestedAccumulate = errors.New("accumulate: Accumulate called inside Accumulate; call it once per batch")

// Accumulate runs fn as one micro-batch of an accumulation cycle.
func (s *GradientState) Accumulate(fn func() error) error {
	if s.inAccumulate {
		return ErrNestedAccumulate
	}
	s.stepInCycle++
	s.syncThisStep = s.EndOfDataloader() || s.stepInCycle%s.steps == 0
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

// recordMicroBatch notes that a micro-batch was added with the given scale.
func (s *GradientState) recordMicroBatch(scale float64) {
	if s.inAccumulate && scale == 1/float64(s.steps) {
		s.scaledMicroBatches++
	} else {
		s.unscaledMicroBatches++
	}
}

// syncCorrection is the factor that turns the accumulated sum into the mean over micro-batches when a
// cycle ended early (the data loader ran out after m < K micro-batches, each scaled by 1/K): K/m. It is 1
// for full cycles and for gradients the user scaled themselves.
func (s *GradientState) syncCorrection() float64 {
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

// Position returns the resumable part of the state. Inside the Accumulate call that syncs, the cycle is
// over (a checkpoint written there, after the optimizer's step, resumes at the next cycle's start).
func (s *GradientState) Position() Position {
	step := s.stepInCycle
	if s.inAccumulate && s.syncThisStep {
		step = 0
	}
	return Position{StepInCycle: step, ScaledMicroBatches: s.scaledMicroBatches,
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

// SavedCycle is what a checkpoint records of the gradient state: the run's settings and where in an
// accumulation cycle it was taken. The JSON names are those of a checkpoint's state.json, which embeds it;
// whether each model's accumulators held a partial cycle is recorded beside its accumulators
// (SavedAccumulators), and Accumulating sums that up.
type SavedCycle struct {
	WorldSize     int      `json:"world_size"`
	Steps         int      `json:"accumulation_steps"` // K
	SyncEachBatch bool     `json:"sync_each_batch"`
	Position      Position `json:"gradient"`
	// Accumulating says that some model's accumulators held micro-batches of an unfinished cycle.
	Accumulating bool `json:"-"`
}

// AtStepBoundary reports whether the checkpoint was taken between optimizer steps: no micro-batch was
// accumulated since the last sync, so the accumulators are empty on every rank and the optimizer state is
// replicated. Nothing of such a checkpoint depends on the number of ranks or on K.
func (c SavedCycle) AtStepBoundary() bool { return !c.Accumulating && c.Position == Position{} }

// ErrInsideCycle is CheckResume's error (wrapped) for a checkpoint taken inside an accumulation cycle
// that a run with another world size, K or sync-each-batch cannot continue.
var ErrInsideCycle = errors.New("accumulate: the checkpoint was taken inside an accumulation cycle")

// CheckResume returns why this state's run, on worldSize ranks, cannot continue the gradient state saved as
// c, or nil. At an optimizer-step boundary anything may change: the world size, K, sync-each-batch. Inside
// a cycle the accumulators hold each rank's partial sums, scaled by 1/K, and the cycle's micro-batch count:
// they mean the same only with the same world size, K and sync-each-batch.
func (s *GradientState) CheckResume(c SavedCycle, worldSize int) error {
	if c.AtStepBoundary() {
		return nil
	}
	var differs string
	switch {
	case c.WorldSize != worldSize:
		differs = fmt.Sprintf("it was saved by %d processes and this run has %d", c.WorldSize, worldSize)
	case c.Steps != s.steps:
		differs = fmt.Sprintf("it was saved with %d accumulation steps and this run uses %d", c.Steps, s.steps)
	case c.SyncEachBatch != s.syncEachBatch:
		differs = fmt.Sprintf("it was saved with sync-each-batch %t and this run has %t", c.SyncEachBatch, s.syncEachBatch)
	default:
		return s.CheckPosition(c.Position)
	}
	return fmt.Errorf("%w (%d of K=%d micro-batches accumulated, per process) and %s: its partial gradients "+
		"resume only on the same number of processes, K and sync-each-batch; save at an optimizer-step "+
		"boundary (after the Step that applied the gradients) to resume on another configuration",
		ErrInsideCycle, c.Position.StepInCycle, c.Steps, differs)
}

// ResumePosition is the position to restore for a checkpoint that CheckResume accepted: the saved one,
// or at a step boundary the start of a cycle, whatever K was.
func (c SavedCycle) ResumePosition() Position {
	if c.AtStepBoundary() {
		return Position{}
	}
	return c.Position
}

// ResumePlan is what a checkpoint's accumulation cycle restores, once PlanResume accepted it.
type ResumePlan struct {
	// Position is the gradient state's position to restore (see SavedCycle.ResumePosition).
	Position Position
	// AtStepBoundary: the checkpoint was taken between optimizer steps (see SavedCycle.AtStepBoundary).
	AtStepBoundary bool
	// Reducers are this rank's reducer states, model by model, for Reducer.Restore.
	Reducers []ReducerState
}

// PlanResume checks a checkpoint's accumulation cycle against this run — the settings, the position, and
// every model's saved accumulators (GatherState's layout) with what its reducer needs — and returns what
// to restore. It changes nothing: the one validation of the cycle's part of a checkpoint.
func (s *GradientState) PlanResume(c SavedCycle, saved []SavedAccumulators, blobs [][]byte, reducers []*Reducer,
	worldSize int) (ResumePlan, error) {
	if len(saved) != len(reducers) || len(blobs) != len(reducers) {
		return ResumePlan{}, fmt.Errorf("accumulate: the checkpoint records %d model(s) and %d accumulator "+
			"file(s), this run has %d", len(saved), len(blobs), len(reducers))
	}
	c.Accumulating = false
	for _, m := range saved {
		c.Accumulating = c.Accumulating || m.Accumulating
	}
	if err := s.CheckResume(c, worldSize); err != nil {
		return ResumePlan{}, err
	}
	plan := ResumePlan{Position: c.ResumePosition(), AtStepBoundary: c.AtStepBoundary()}
	for i, r := range reducers {
		mine, err := r.SavedState(blobs[i], c.WorldSize, saved[i].Accumulating)
		if err == nil {
			err = r.CheckRestore(mine)
		}
		if err != nil {
			return ResumePlan{}, fmt.Errorf("model %d: %w", i, err)
		}
		plan.Reducers = append(plan.Reducers, mine)
	}
	return plan, nil
}
