package prepare

import (
	"fmt"
	"sync/atomic"
	"time"

	gomlxbackends "github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/tensors"
)

// PhaseKind is what a prepared model, optimizer or loader is doing (see Phase).
type PhaseKind uint8

const (
	// PhaseNone: none of the phases below is under way.
	PhaseNone PhaseKind = iota
	// PhaseBackward is a Backward call for micro-batch Index: its checks, the compiled step and, when the
	// micro-batch syncs, the gradient sync.
	PhaseBackward
	// PhaseForwardBackward is the compiled forward and backward pass of micro-batch Index, inside
	// PhaseBackward.
	PhaseForwardBackward
	// PhaseOptimizerStep is optimizer step Index being applied: from the decision to apply it to the end of
	// the functions run after it (the replica check).
	PhaseOptimizerStep
	// PhaseRefresh, PhaseUpdate and PhaseAllGather are the parts of optimizer step Index under a sharding
	// strategy: the parameter blocks refreshed from the parameters, the update of the blocks, and the
	// all-gather of the updated blocks into the parameters.
	PhaseRefresh
	PhaseUpdate
	PhaseAllGather
	// PhaseLoad is a loader's source producing a batch of Index examples (see Runtime.ObserveSource). It
	// runs on the loader's goroutine, which prefetches in the background: observers hear of it, and it is
	// never the runtime's current phase.
	PhaseLoad
	numPhaseKinds
)

// Phase is what the prepared objects are doing: a kind, and the micro-batch, optimizer step or number
// of examples it is about. Runtime.Phase says which is under way, for a hang report or an error ("backward
// of micro-batch 471"); a phase observer hears of each one as it ends, for a timeline.
type Phase struct {
	Kind PhaseKind
	// Index is the micro-batch (PhaseBackward, PhaseForwardBackward: the model's Backward calls, counted
	// from 1 in this process), the optimizer step (counted from 1, checkpoints included) or the number of
	// examples (PhaseLoad).
	Index int64
	// Syncs says that the micro-batch syncs its gradients (PhaseBackward, PhaseForwardBackward).
	Syncs bool
}

// String says what the phase is, as an error message continues "during ...": "backward of micro-batch
// 471", "optimizer step 12"; empty for PhaseNone.
func (p Phase) String() string {
	switch p.Kind {
	case PhaseBackward:
		return fmt.Sprintf("backward of micro-batch %d", p.Index)
	case PhaseForwardBackward:
		return fmt.Sprintf("the forward and backward pass of micro-batch %d", p.Index)
	case PhaseOptimizerStep:
		return fmt.Sprintf("optimizer step %d", p.Index)
	case PhaseRefresh:
		return fmt.Sprintf("optimizer step %d (refreshing the parameter blocks)", p.Index)
	case PhaseUpdate:
		return fmt.Sprintf("optimizer step %d (updating the parameter blocks)", p.Index)
	case PhaseAllGather:
		return fmt.Sprintf("optimizer step %d (all-gathering the parameters)", p.Index)
	case PhaseLoad:
		return fmt.Sprintf("loading a batch of %d examples", p.Index)
	}
	return ""
}

// A phase is kept packed in one word, so that the training goroutine records it with one atomic store
// and a reader on another goroutine (a hang report) never sees half of one: the kind in the low 8 bits,
// Syncs in bit 8, the index above.
func (p Phase) pack() uint64 {
	w := uint64(p.Kind) | uint64(p.Index)<<9
	if p.Syncs {
		w |= 1 << 8
	}
	return w
}

func unpackPhase(w uint64) Phase {
	return Phase{Kind: PhaseKind(w & 0xff), Syncs: w&(1<<8) != 0, Index: int64(w >> 9)}
}

// PhaseObserver is told of every phase as it ends, with when it began and ended, on the goroutine that
// ran it. It must be quick: it runs inside the training step.
type PhaseObserver func(p Phase, begin, end time.Time)

// phases is a Runtime's record of what its prepared objects are doing.
type phases struct {
	current  atomic.Uint64
	observer atomic.Pointer[PhaseObserver]
}

// phaseSpan is a phase begun by beginPhase, for endPhase: the phase it interrupted, and when it began
// (only taken when an observer listens).
type phaseSpan struct {
	phase Phase
	prev  uint64
	begin time.Time
}

// Phase is the innermost phase under way on the training goroutine (Kind PhaseNone when none). It is safe
// to call from any goroutine.
func (rt *Runtime) Phase() Phase { return unpackPhase(rt.phases.current.Load()) }

// SetPhaseObserver installs fn, told of every phase as it ends (see PhaseObserver); nil removes it. Without
// an observer a phase costs two atomic stores and no clock reading.
func (rt *Runtime) SetPhaseObserver(fn PhaseObserver) {
	if fn == nil {
		rt.phases.observer.Store(nil)
		return
	}
	rt.phases.observer.Store(&fn)
}

// beginPhase records that the phase of kind, index and syncs began; endPhase(span) that it ended.
func (rt *Runtime) beginPhase(kind PhaseKind, index int64, syncs bool) phaseSpan {
	s := phaseSpan{phase: Phase{Kind: kind, Index: index, Syncs: syncs}}
	s.prev = rt.phases.current.Swap(s.phase.pack())
	if rt.phases.observer.Load() != nil {
		s.begin = time.Now()
	}
	return s
}

// endPhase ends s: the phase it interrupted is current again, and the observer hears of s.
func (rt *Runtime) endPhase(s phaseSpan) {
	rt.phases.current.Store(s.prev)
	rt.observePhase(s.phase, s.begin)
}

// observePhase tells the observer, if any, that p, begun at begin, ends now. A phase begun before the
// observer was installed has no beginning and is not told.
func (rt *Runtime) observePhase(p Phase, begin time.Time) {
	if fn := rt.phases.observer.Load(); fn != nil && !begin.IsZero() {
		(*fn)(p, begin, time.Now())
	}
}

// ObserveSource returns src, whose batches tell the runtime's phase observer how long each took to
// produce (PhaseLoad), whether the loader gathers them in the loop or prefetches them in the background.
// The batches are src's, unchanged. Prepare a loader on the returned source.
func (rt *Runtime) ObserveSource(src Source) Source {
	if o, ok := src.(*observedSource); ok && o.rt == rt {
		return src
	}
	return &observedSource{Source: src, rt: rt}
}

// observedSource times its source's batches. It forwards batchOn, so that a source that gathers batches
// straight onto the compute backend still does.
type observedSource struct {
	Source
	rt *Runtime
}

func (s *observedSource) Batch(indices []int) (inputs, labels []*tensors.Tensor, err error) {
	begin := s.beginLoad()
	inputs, labels, err = s.Source.Batch(indices)
	s.rt.observePhase(Phase{Kind: PhaseLoad, Index: int64(len(indices))}, begin)
	return inputs, labels, err
}

func (s *observedSource) batchOn(backend gomlxbackends.Backend, indices []int) (inputs, labels []*tensors.Tensor, err error) {
	b, ok := s.Source.(backendSource)
	if !ok {
		return s.Batch(indices)
	}
	begin := s.beginLoad()
	inputs, labels, err = b.batchOn(backend, indices)
	s.rt.observePhase(Phase{Kind: PhaseLoad, Index: int64(len(indices))}, begin)
	return inputs, labels, err
}

func (s *observedSource) beginLoad() time.Time { return s.rt.beginLoad() }

// beginLoad is when a batch's loading began, for observeLoad; the zero time (and no clock read) when
// nobody observes phases.
func (rt *Runtime) beginLoad() time.Time {
	if rt.phases.observer.Load() == nil {
		return time.Time{}
	}
	return time.Now()
}

// observeLoad tells the phase observer that a stream produced a batch of batch's examples since begin.
func (rt *Runtime) observeLoad(begin time.Time, inputs []*tensors.Tensor) {
	if begin.IsZero() {
		return
	}
	rows := int64(0)
	if len(inputs) > 0 && inputs[0].Shape().Rank() > 0 {
		rows = int64(inputs[0].Shape().Dimensions[0])
	}
	rt.observePhase(Phase{Kind: PhaseLoad, Index: rows}, begin)
}

// inPhase runs fn as the phase of kind and index.
func (rt *Runtime) inPhase(kind PhaseKind, index int64, fn func() error) error {
	defer rt.endPhase(rt.beginPhase(kind, index, false))
	return fn()
}
