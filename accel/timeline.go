package accel

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/jobenv"
	"github.com/goaccel/goaccel/internal/traceevent"
	"github.com/goaccel/goaccel/prepare"
)

// TimelineEnvVar names the file the job's timeline is written to (see WithTimeline); `accel launch
// --timeline PATH` sets it for every process.
const TimelineEnvVar = jobenv.Timeline

// WithTimeline records a timeline of the job and writes it to path when the accelerator closes: a Chrome
// trace-event JSON file, which Perfetto (ui.perfetto.dev) and chrome://tracing open. Each process is a row,
// "rank N", with tracks for its training (each micro-batch, its compiled forward and backward pass, its waits
// for the gradient sync, the optimizer steps and their parts under sharding, checkpoint saves and loads),
// the batches its loaders produce, and every collective from start to completion, one track per gradient
// bucket. A restarted job marks its start with an instant event.
//
// Every process records its own events in memory; Close, which is collective, aligns the processes' clocks
// to the main process's, gathers the events there and writes the file (through a temporary file renamed
// over path). A process whose communicator failed writes its own events to path.rank-N.json instead.
// GOACCEL_TIMELINE=path turns it on too; every process must agree on whether it is on (they compare it on
// the first Backward). Off, it costs nothing but a nil check. docs/observe.md, "Timeline", says what it shows
// and how the clocks are aligned.
func WithTimeline(path string) Option { return func(c *config) { c.timeline = path } }

// maxTimelineEvents bounds the events a process keeps (about 200 bytes each): a long job keeps its first
// ones and counts the others, which the file's metadata reports.
const maxTimelineEvents = 1 << 20

// timeline is one process's recorder. Its methods are safe on a nil *timeline, which records nothing:
// the accelerator's timeline is nil when it is off.
type timeline struct {
	path       string
	rank, size int
	// epoch is this process's clock's zero: events are kept as nanoseconds since it, on the monotonic clock.
	epoch time.Time
	// paused: the timeline's own collectives (aligning the clocks, gathering the events) are not recorded.
	paused atomic.Bool

	mu sync.Mutex
	// chunks hold the events, timelineChunk to a chunk: a full chunk is never copied, so recording an event
	// costs the same however many came before.
	chunks  [][]timelineEvent
	events  int
	dropped int64
	// clocks are the alignments of this process's clock to the main process's, measured on the first
	// Backward and at Close.
	clocks []clockSample
}

type timelineEventKind uint8

const (
	eventPhase timelineEventKind = iota
	eventCollective
	eventCheckpoint
	eventInstant
)

// timelineEvent is one recorded event, as plain values: no formatting until the file is written.
type timelineEvent struct {
	kind       timelineEventKind
	phase      prepare.Phase
	collective backends.CollectiveRecord
	name       string
	begin, end int64 // nanoseconds since epoch
}

func newTimeline(path string, rank, size int) *timeline {
	return &timeline{path: path, rank: rank, size: size, epoch: time.Now()}
}

// now is this process's timeline clock: nanoseconds since its epoch (0 when the timeline is off).
func (t *timeline) now() int64 {
	if t == nil {
		return 0
	}
	return int64(time.Since(t.epoch))
}

func (t *timeline) since(at time.Time) int64 { return int64(at.Sub(t.epoch)) }

// timelineChunk is the number of events a chunk holds.
const timelineChunk = 4096

func (t *timeline) add(e timelineEvent) {
	t.mu.Lock()
	switch {
	case t.events >= maxTimelineEvents:
		t.dropped++
	default:
		if n := len(t.chunks); n == 0 || len(t.chunks[n-1]) == timelineChunk {
			t.chunks = append(t.chunks, make([]timelineEvent, 0, timelineChunk))
		}
		last := &t.chunks[len(t.chunks)-1]
		*last = append(*last, e)
		t.events++
	}
	t.mu.Unlock()
}

// onPhase is the runtime's phase observer.
func (t *timeline) onPhase(p prepare.Phase, begin, end time.Time) {
	t.add(timelineEvent{kind: eventPhase, phase: p, begin: t.since(begin), end: t.since(end)})
}

// onCollective is the communicator's observer.
func (t *timeline) onCollective(r backends.CollectiveRecord) {
	if t.paused.Load() {
		return
	}
	t.add(timelineEvent{kind: eventCollective, collective: r, begin: t.since(r.Started), end: t.since(r.Ended)})
}

// span records a checkpoint's save or load, name, from begin (now()) to now.
func (t *timeline) span(name string, begin int64) {
	if t == nil {
		return
	}
	t.add(timelineEvent{kind: eventCheckpoint, name: name, begin: begin, end: t.now()})
}

// instant records a moment, name, now.
func (t *timeline) instant(name string) {
	if t == nil {
		return
	}
	now := t.now()
	t.add(timelineEvent{kind: eventInstant, name: name, begin: now, end: now})
}

// clockSample is one alignment of this process's clock to the main process's: at this process's time at
// (its nanoseconds since epoch), the main process's clock reads offset more, give or take bound.
type clockSample struct {
	at, offset, bound int64
}

// clockRounds is how many exchanges an alignment takes: the first absorbs the processes' arrival skew,
// the tightest of the others is kept.
const clockRounds = 5

// measureClock aligns this process's clock to the main process's. Each round, every process notes its
// time b, enters a barrier, then, once out, all-gathers its time. The main process read its time after it
// left the barrier, so after this process entered it (b), and before it entered the all-gather, so before
// this process left it (e, noted after the all-gather): the main process's reading T0 fell within [b, e]
// of this process's clock. Taking it at the middle is off by at most (e-b)/2; the round with the narrowest
// window is kept. Collective.
func (t *timeline) measureClock(comm *backends.Communicator) error {
	t.paused.Store(true)
	defer t.paused.Store(false)
	best := clockSample{bound: -1}
	mine := make([]int64, 1)
	all := make([]int64, comm.Size())
	for range clockRounds {
		b := t.now()
		if err := comm.Barrier(); err != nil {
			return fmt.Errorf("accel: timeline: aligning the clocks: %w", err)
		}
		mine[0] = t.now()
		if err := comm.AllGather(backends.BufferOf(mine), backends.BufferOf(all)); err != nil {
			return fmt.Errorf("accel: timeline: aligning the clocks: %w", err)
		}
		e := t.now()
		s := clockSample{at: (b + e) / 2, offset: all[0] - (b+e)/2, bound: (e - b + 1) / 2}
		if t.rank == 0 {
			s.offset, s.bound = 0, 0
		}
		if best.bound < 0 || s.bound < best.bound {
			best = s
		}
	}
	t.mu.Lock()
	t.clocks = append(t.clocks, best)
	t.mu.Unlock()
	return nil
}

// offset is what to add to this process's time at to read the main process's clock: the alignments
// interpolated (clocks drift apart slowly: two alignments, one at each end of the run, follow the drift),
// the one alignment there is, or none.
func (t *timeline) offset(at int64) int64 {
	switch len(t.clocks) {
	case 0:
		return 0
	case 1:
		return t.clocks[0].offset
	}
	c0, c1 := t.clocks[0], t.clocks[len(t.clocks)-1]
	if c1.at == c0.at {
		return c1.offset
	}
	return c0.offset + int64(float64(c1.offset-c0.offset)*float64(at-c0.at)/float64(c1.at-c0.at))
}

// Tracks of a process's row.
const (
	tidTraining = 1
	tidLoading  = 2
	// tidCollectives is the first of the tracks of collectives without a bucket: as many as overlap.
	tidCollectives = 3
	// tidBuckets+b is bucket b's track.
	tidBuckets = 100
)

// file is this process's events as a trace, on the main process's clock, in microseconds.
func (t *timeline) file() traceevent.File {
	t.mu.Lock()
	events := slices.Concat(t.chunks...)
	dropped := t.dropped
	t.mu.Unlock()
	pid := t.rank
	us := func(ns int64) float64 { return float64(ns+t.offset(ns)) / 1e3 }
	slice := func(name, cat string, tid int, begin, end int64, args map[string]any) traceevent.Event {
		return traceevent.Event{Name: name, Cat: cat, Ph: traceevent.PhaseComplete, Ts: us(begin),
			Dur: max(us(end)-us(begin), 0), Pid: pid, Tid: tid, Args: args}
	}
	out := []traceevent.Event{
		traceevent.ProcessName(pid, fmt.Sprintf("rank %d", t.rank)), traceevent.ProcessSortIndex(pid, t.rank),
		traceevent.ThreadName(pid, tidTraining, "training"), traceevent.ThreadSortIndex(pid, tidTraining, tidTraining),
	}
	tracks := map[int]bool{}
	var laneEnds []int64 // when each track of collectives without a bucket is free again
	for _, e := range events {
		switch e.kind {
		case eventPhase:
			name, cat, tid, args := phaseSlice(e.phase)
			tracks[tid] = true
			out = append(out, slice(name, cat, tid, e.begin, e.end, args))
		case eventCollective:
			r := e.collective
			name := r.Call()
			if !r.Label.IsZero() {
				name = r.Op.String() + " " + r.Label.String()
			}
			args := map[string]any{"seq": r.Seq, "call": r.Call(), "bytes": r.Bytes}
			if r.Failed {
				args["failed"] = true
			}
			tid := tidBuckets + r.Label.Index
			if r.Label.What != "bucket" || r.Label.Index < 0 {
				lane := slices.IndexFunc(laneEnds, func(end int64) bool { return end <= e.begin })
				if lane < 0 {
					lane = len(laneEnds)
					laneEnds = append(laneEnds, 0)
				}
				laneEnds[lane] = e.end
				tid = tidCollectives + lane
			}
			tracks[tid] = true
			out = append(out, slice(name, "collective", tid, e.begin, e.end, args),
				slice("wait "+name, "wait", tidTraining, t.since(r.WaitBegan), e.end, map[string]any{"seq": r.Seq}))
		case eventCheckpoint:
			out = append(out, slice(e.name, "checkpoint", tidTraining, e.begin, e.end, nil))
		case eventInstant:
			out = append(out, traceevent.Event{Name: e.name, Ph: traceevent.PhaseInstant, Scope: "p", Ts: us(e.begin),
				Pid: pid, Tid: tidTraining})
		}
	}
	for tid := range tracks {
		var name string
		switch {
		case tid == tidTraining:
			continue
		case tid == tidLoading:
			name = "data loading"
		case tid >= tidBuckets:
			name = fmt.Sprintf("bucket %d", tid-tidBuckets)
		case tid == tidCollectives:
			name = "collectives"
		default:
			name = fmt.Sprintf("collectives (%d)", tid-tidCollectives+1)
		}
		out = append(out, traceevent.ThreadName(pid, tid, name), traceevent.ThreadSortIndex(pid, tid, tid))
	}
	clock := map[string]any{"rank": t.rank}
	if len(t.clocks) > 0 {
		first, last := t.clocks[0], t.clocks[len(t.clocks)-1]
		clock["offset_us"] = float64(first.offset) / 1e3
		clock["error_us"] = float64(max(first.bound, last.bound)) / 1e3
		clock["drift_us"] = float64(last.offset-first.offset) / 1e3
	}
	if dropped > 0 {
		clock["dropped_events"] = dropped
	}
	return traceevent.File{TraceEvents: out, OtherData: map[string]any{fmt.Sprintf("rank %d clock", t.rank): clock,
		"clock alignment": "each rank's clock is aligned to rank 0's at the first Backward and at Close: a " +
			"barrier then an all-gather of every rank's time, " + fmt.Sprint(clockRounds) + " times, the " +
			"narrowest window kept; error_us bounds the error"}}
}

// phaseSlice is how a phase is drawn: its name, category, track and arguments.
func phaseSlice(p prepare.Phase) (name, cat string, tid int, args map[string]any) {
	switch p.Kind {
	case prepare.PhaseBackward:
		name = fmt.Sprintf("micro-batch %d", p.Index)
		if p.Syncs {
			name += " (syncs)"
		}
		return name, "step", tidTraining, map[string]any{"micro_batch": p.Index, "syncs": p.Syncs}
	case prepare.PhaseForwardBackward:
		return fmt.Sprintf("forward+backward %d", p.Index), "compute", tidTraining,
			map[string]any{"micro_batch": p.Index, "syncs": p.Syncs}
	case prepare.PhaseOptimizerStep:
		return fmt.Sprintf("optimizer step %d", p.Index), "optimizer", tidTraining, map[string]any{"step": p.Index}
	case prepare.PhaseRefresh:
		return "refresh blocks", "optimizer", tidTraining, map[string]any{"step": p.Index}
	case prepare.PhaseUpdate:
		return "update blocks", "optimizer", tidTraining, map[string]any{"step": p.Index}
	case prepare.PhaseAllGather:
		return "all-gather parameters", "optimizer", tidTraining, map[string]any{"step": p.Index}
	case prepare.PhaseLoad:
		return fmt.Sprintf("load batch (%d examples)", p.Index), "load", tidLoading, map[string]any{"examples": p.Index}
	}
	return p.String(), "", tidTraining, nil
}

// startTimeline turns the timeline on when the configuration asks for it.
func (a *Accelerator) startTimeline() {
	if a.cfg.timeline == "" {
		return
	}
	t := newTimeline(a.cfg.timeline, a.topo.Rank, a.topo.WorldSize)
	a.timeline = t
	a.rt.SetPhaseObserver(t.onPhase)
	a.comm.SetObserver(t.onCollective)
	if a.cfg.restartCount > 0 {
		t.instant(fmt.Sprintf("restart %d", a.cfg.restartCount))
	}
}

// alignTimeline aligns the clocks on the first Backward (collective; see measureClock).
func (a *Accelerator) alignTimeline() error {
	if a.timeline == nil || a.WorldSize() == 1 {
		return nil
	}
	return a.timeline.measureClock(a.comm)
}

// finishTimeline writes the timeline as the accelerator closes: on one process, to its path; on several
// whose communicator still works, the main process merges every process's events into the path
// (collective); otherwise each process writes its own to path.rank-N.json.
func (a *Accelerator) finishTimeline() error {
	t := a.timeline
	if t == nil {
		return nil
	}
	a.timeline = nil
	a.comm.SetObserver(nil)
	a.rt.SetPhaseObserver(nil)
	if t.size == 1 {
		return traceevent.WriteFile(t.path, traceevent.Merge(t.file()))
	}
	own := func(cause error) error {
		path := fmt.Sprintf("%s.rank-%d.json", t.path, t.rank)
		return errors.Join(cause, traceevent.WriteFile(path, traceevent.Merge(t.file())))
	}
	if a.comm.Broken() != nil || a.comm.Closed() {
		return own(nil)
	}
	if err := t.measureClock(a.comm); err != nil {
		return own(err)
	}
	data, err := traceevent.Encode(t.file())
	if err != nil {
		return own(err)
	}
	t.paused.Store(true)
	all, err := allGatherBytes(a.comm, data)
	if err != nil {
		return own(err)
	}
	if t.rank != 0 {
		return nil
	}
	files := make([]traceevent.File, len(all))
	for r, data := range all {
		if files[r], err = traceevent.Decode(data); err != nil {
			return fmt.Errorf("accel: timeline: rank %d's events: %w", r, err)
		}
	}
	if err := traceevent.WriteFile(t.path, traceevent.Merge(files...)); err != nil {
		return fmt.Errorf("accel: timeline: %w", err)
	}
	return nil
}

// allGatherBytes gives every rank each rank's data, of any length. Collective.
func allGatherBytes(comm *backends.Communicator, data []byte) ([][]byte, error) {
	size := comm.Size()
	lens := make([]int64, size)
	if err := comm.AllGather(backends.BufferOf([]int64{int64(len(data))}), backends.BufferOf(lens)); err != nil {
		return nil, err
	}
	longest := slices.Max(lens)
	send := make([]byte, max(longest, 1))
	copy(send, data)
	recv := make([]byte, len(send)*size)
	if err := comm.AllGather(backends.BufferOf(send), backends.BufferOf(recv)); err != nil {
		return nil, err
	}
	out := make([][]byte, size)
	for r := range size {
		out[r] = recv[r*len(send) : r*len(send)+int(lens[r])]
	}
	return out, nil
}
