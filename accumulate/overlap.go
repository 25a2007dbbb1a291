package accumulate

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/floats"
)

// A step that overlaps its sync with its backward pass hands each bucket to the reducer from inside the
// compiled step, as soon as the backward pass has produced it (BucketReady), and the reducer starts that
// bucket's communication there; the sync that follows the step then waits for those buckets instead of
// starting them (docs/overlap.md). Only a micro-batch that syncs, under Replicated, on more than one
// process does so: the bucket the step hands over is the accumulator's final value, the very memory the
// sync reduces in place, so the sums are the same as without overlap, bit for bit.

// progressEvery is how often the progress goroutine polls a bucket in flight while the step computes.
// Open MPI advances a non-blocking collective only inside MPI calls: without polls an all-reduce started
// during the backward pass gets no further than its first messages before the step returns. A poll costs a
// few microseconds of the core the step computes on; each round of a ring all-reduce waits for one.
var progressEvery = 50 * time.Microsecond

// overlap is the reducer's state for buckets started inside a step.
type overlap struct {
	mu sync.Mutex
	// armed: the micro-batch running now syncs, and its buckets may be started as they become ready.
	armed bool
	// next is the bucket to start next: buckets start in plan order on every rank (collectives must be
	// issued in the same order everywhere), whatever order a parallel executor computes them in.
	next int
	// ready holds buckets handed over before every earlier one was: their data, and the loss.
	ready map[int]any
	// pending are the started buckets' communications, by bucket.
	pending []Waiter
	// poisoned: bucket 0 was started with its first element set to NaN (a non-finite loss).
	poisoned bool
	// startedAt is when each started bucket left; stats what overlapping did since the reducer was made.
	startedAt []time.Time
	stats     OverlapStats
	err       error
	// stop ends the progress goroutine, which closes done when it has.
	stop, done chan struct{}
}

// ArmOverlap tells the reducer that the micro-batch about to run syncs, and that its step may hand over
// its buckets as they become ready (BucketReady). It reports whether it armed: only a micro-batch that
// syncs, under Replicated, on more than one process, with nothing emitted, overlaps; any other syncs after
// its step as before. Called by the prepared model before it runs a step built with marked buckets.
func (r *Reducer) ArmOverlap() bool {
	if r.forModel() != nil || !r.state.SyncGradients() || r.Sharded() || r.comm.Size() < 2 || r.emitted != nil ||
		r.synced {
		return false
	}
	o := &r.overlap
	o.mu.Lock()
	defer o.mu.Unlock()
	o.armed, o.next, o.poisoned, o.err = true, 0, false, nil
	o.ready = map[int]any{}
	o.pending = make([]Waiter, len(r.plan.Buckets))
	o.startedAt = make([]time.Time, len(r.plan.Buckets))
	return true
}

// BucketReady is called from inside a step armed by ArmOverlap, on the goroutine that runs it, when the
// step has computed bucket b's final value: flat is its data, the memory the step outputs as the bucket's
// accumulator, and loss the micro-batch's loss on this rank. The reducer starts the bucket's communication
// through the comm hook at once, or as soon as every earlier bucket was handed over. Outside an armed step
// it does nothing.
func (r *Reducer) BucketReady(b int, flat any, loss float64) {
	o := &r.overlap
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.armed || o.err != nil || b < o.next || b >= len(r.plan.Buckets) {
		return
	}
	if b == 0 && (r.nonFinite || math.IsNaN(loss) || math.IsInf(loss, 0)) {
		// What reduce does after the step, done before the bucket leaves: every rank sees a non-finite sum.
		floats.Do(flat, poisonFirst[float32], poisonFirst[float64])
		o.poisoned = true
	}
	o.ready[b] = flat
	for {
		data, ok := o.ready[o.next]
		if !ok {
			return
		}
		delete(o.ready, o.next)
		if o.err = r.startReady(o.next, data); o.err != nil {
			return
		}
		o.startedAt[o.next] = time.Now()
		o.next++
		o.stats.Buckets++
	}
}

// startReady starts bucket b's communication on data (o.mu held).
func (r *Reducer) startReady(b int, data any) error {
	buf, err := backends.Elements(data)
	if err != nil {
		return fmt.Errorf("accumulate: bucket %d: %w", b, err)
	}
	layout := r.plan.Buckets[b]
	if buf.Len != layout.Size {
		return fmt.Errorf("accumulate: bucket %d handed over with %d elements, the plan has %d", b, buf.Len, layout.Size)
	}
	p, err := r.hook.Start(r.comm, Replicated{}, GradBucket{Index: b, Layout: layout, Params: r.plan.Params,
		Buffer: buf, Shard: buf})
	if err != nil {
		return fmt.Errorf("accumulate: all-reduce of bucket %d (%d bytes): %w", b, layout.Bytes(), err)
	}
	r.overlap.pending[b] = p
	if r.overlap.stop == nil {
		r.overlap.stop, r.overlap.done = make(chan struct{}), make(chan struct{})
		go r.progress(r.overlap.stop, r.overlap.done)
	}
	return nil
}

// progressor is a Waiter whose communication can be advanced without waiting (*backends.Pending).
type progressor interface {
	Progress() bool
}

// progress polls the buckets in flight until stop is closed, so that their collectives advance while the
// step computes.
func (r *Reducer) progress(stop, done chan struct{}) {
	defer close(done)
	o := &r.overlap
	ticker := time.NewTicker(progressEvery)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		o.mu.Lock()
		var oldest progressor
		for _, w := range o.pending {
			if p, ok := w.(progressor); ok {
				oldest = p
				break
			}
		}
		o.mu.Unlock()
		// One poll advances every collective in flight (Open MPI progresses them all in any MPI_Test); the
		// oldest is the one that completes first.
		if oldest != nil && oldest.Progress() {
			o.mu.Lock()
			for i, w := range o.pending {
				if p, ok := w.(progressor); ok && p == oldest {
					o.pending[i] = doneWaiter{w}
				}
			}
			o.mu.Unlock()
		}
	}
}

// doneWaiter is a bucket whose communication the progress goroutine saw complete: waited for like any
// other, but no longer polled.
type doneWaiter struct{ Waiter }

// finishOverlap ends an armed step's overlap after the step returned: it starts, in plan order, the buckets
// the step did not hand over (every bucket when the step had no marked buckets), on their accumulators,
// and waits for every bucket. It reports whether the reducer was armed; on false it did nothing.
func (r *Reducer) finishOverlap() (bool, error) {
	o := &r.overlap
	o.mu.Lock()
	if !o.armed {
		o.mu.Unlock()
		return false, nil
	}
	o.armed = false
	// What the buckets started inside the step got done while it ran.
	stepEnd := time.Now()
	for b, w := range o.pending {
		if w == nil {
			continue
		}
		o.stats.InStep += stepEnd.Sub(o.startedAt[b])
		if _, done := w.(doneWaiter); done {
			o.stats.DoneInStep++
		}
	}
	err := o.err
	if err == nil && o.next < len(r.plan.Buckets) {
		values, verr := r.bucketTensors()
		if verr != nil {
			err = verr
		}
		for b := o.next; err == nil && b < len(r.plan.Buckets); b++ {
			var flat any
			if flat, err = hostFlat(values[b]); err != nil {
				break
			}
			if b == 0 && r.nonFinite {
				floats.Do(flat, poisonFirst[float32], poisonFirst[float64])
				o.poisoned = true
			}
			err = r.startReady(b, flat)
			runtime.KeepAlive(values)
		}
	}
	pending, stop, done := o.pending, o.stop, o.done
	o.pending, o.ready, o.stop, o.done = nil, nil, nil, nil
	poisoned := o.poisoned
	o.mu.Unlock()
	waitErr := waitStarted(pending)
	if stop != nil {
		close(stop)
		<-done
	}
	if err == nil && waitErr != nil {
		err = fmt.Errorf("accumulate: gradient sync: %w", waitErr)
	}
	if err != nil {
		return true, err
	}
	if poisoned {
		r.nonFinite, r.poisoned = false, true
	}
	return true, nil
}

// AbortOverlap waits for the buckets an armed step started and disarms, for a step that failed: the
// engines may be writing into the step's outputs until they complete. It returns the first error of
// those communications.
func (r *Reducer) AbortOverlap() error {
	o := &r.overlap
	o.mu.Lock()
	if !o.armed {
		o.mu.Unlock()
		return nil
	}
	o.armed = false
	pending, stop, done := o.pending, o.stop, o.done
	o.pending, o.ready, o.stop, o.done = nil, nil, nil, nil
	o.mu.Unlock()
	err := waitStarted(pending)
	if stop != nil {
		close(stop)
		<-done
	}
	return err
}

// OverlapStats is what starting buckets inside the steps did (see ArmOverlap), since the reducer was made.
type OverlapStats struct {
	// Buckets counts the buckets whose communication started inside a step, while its backward pass ran
	// (each is still counted once in the sync that waits for it).
	Buckets int64
	// DoneInStep counts those whose communication had completed when the step returned.
	DoneInStep int64
	// InStep is the time those buckets' communications had, summed over buckets, between their start
	// and the end of their step: what could overlap the step's computation.
	InStep time.Duration
}

// OverlapStats returns what starting buckets inside the steps did so far.
func (r *Reducer) OverlapStats() OverlapStats {
	o := &r.overlap
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stats
}

// OverlappedBuckets is OverlapStats().Buckets.
func (r *Reducer) OverlappedBuckets() int64 { return r.OverlapStats().Buckets }

func waitStarted(pending []Waiter) error {
	var first error
	for _, w := range pending {
		if w == nil {
			continue
		}
		if err := w.Wait(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
