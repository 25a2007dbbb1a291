package prepare

import (
	"slices"
	"time"
)

// The pure-Go backend runs a graph's independent operations in parallel whenever one graph executes alone;
// on a small model the hand-overs between its goroutines cost more than they overlap (the demo's MLP on one
// process of 2 cores trained 1.37× faster with its operations one after another), while a convolutional
// network or a transformer gains 10–20% from them. Which one a program's step prefers is measured on its
// own first micro-batches: after a few left out (compilation, memory touched for the first time), they run
// alternately in parallel and in sequence, and once each way has tunePerMode of them the faster, by its
// median, stays for the rest of the process. The values computed do not change: the same operations run,
// only their order in time differs.

const (
	tuneWarmup  = 3 // micro-batches left out before the measurement
	tunePerMode = 5 // micro-batches measured each way
	// tuneMargin is how much faster, by median, the sequential schedule must be to replace the backend's
	// own: on a near tie the default stays.
	tuneMargin = 0.97
)

// opsTuner measures both schedules on the runtime's first micro-batches and keeps the faster.
type opsTuner struct {
	// set applies a schedule; measured is set for the final choice.
	set   func(sequential, measured bool) error
	seen  int
	times [2][]time.Duration // by schedule: parallel, sequential
	done  bool
}

// measuring is the schedule the current micro-batch measures: 0 parallel, 1 sequential.
func (t *opsTuner) measuring() int { return (t.seen - tuneWarmup) % 2 }

// before sets the schedule the coming micro-batch is measured with.
func (t *opsTuner) before() {
	if t == nil || t.done || t.seen < tuneWarmup {
		return
	}
	if t.set(t.measuring() == 1, false) != nil {
		t.done = true // the backend's internals changed: keep its own schedule (cpu's tests catch this)
	}
}

// after records the micro-batch's time and, once both schedules have been measured enough, keeps the faster.
func (t *opsTuner) after(elapsed time.Duration) {
	if t == nil || t.done {
		return
	}
	defer func() { t.seen++ }()
	if t.seen < tuneWarmup {
		return
	}
	m := t.measuring()
	t.times[m] = append(t.times[m], elapsed)
	if len(t.times[0]) < tunePerMode || len(t.times[1]) < tunePerMode {
		return
	}
	t.done = true
	sequential := float64(medianDuration(t.times[1])) < tuneMargin*float64(medianDuration(t.times[0]))
	_ = t.set(sequential, true)
}

func medianDuration(d []time.Duration) time.Duration {
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}
