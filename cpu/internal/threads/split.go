package threads

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Splitting an operation over goroutines with a sync.WaitGroup costs little when the other cores are busy
// and a lot when they are idle: an idle core's thread sleeps in the kernel, and on a virtual machine waking
// it costs tens of microseconds (30 µs per fork and join on the development machine, against 1 µs when it
// was awake). A training step runs hundreds of split operations a few microseconds to a millisecond apart,
// so those wake-ups ate what the second core gave. Split hands parts to workers that stay awake: each
// spins for a while after its last part, yielding its processor to any other goroutine, and only then
// sleeps. See docs/notes.md, Note [Workers that stay awake].

// spinWindow is how long a worker stays awake without work before it sleeps: longer than the gaps between
// the split operations of a step, short enough that a process between steps leaves the core alone.
const spinWindow = 2 * time.Millisecond

// yieldEvery is how many polls of its slot a spinning goroutine makes between two runtime.Gosched calls,
// so that a spinning worker never keeps a goroutine that has work from a processor for long.
const yieldEvery = 64

// job is one Split call: its function, and how many parts handed to workers are still running.
type job struct {
	fn      func(part int)
	pending atomic.Int32
}

// worker runs one part at a time: claimed by a Split (busy), handed a part (slot), and woken through wake
// when it had gone to sleep.
type worker struct {
	busy     atomic.Bool
	slot     atomic.Pointer[assignment]
	sleeping atomic.Bool
	wake     chan struct{}
}

type assignment struct {
	job  *job
	part int
}

var pool struct {
	mu      sync.Mutex
	workers atomic.Pointer[[]*worker]
}

// workers returns at least n−1 workers when it can: the pool grows to the budget, never beyond it.
func workers(n int) []*worker {
	if ws := pool.workers.Load(); ws != nil && len(*ws) >= n-1 {
		return *ws
	}
	pool.mu.Lock()
	defer pool.mu.Unlock()
	var ws []*worker
	if p := pool.workers.Load(); p != nil {
		ws = *p
	}
	for len(ws) < min(n, Budget())-1 {
		w := &worker{wake: make(chan struct{}, 1)}
		go w.loop()
		ws = append(ws[:len(ws):len(ws)], w)
	}
	pool.workers.Store(&ws)
	return ws
}

// Split calls fn(part) for every part in [0, n) and returns when all have returned: part 0 and every part
// no idle worker could take on the calling goroutine, the others on the pool's workers at once. A part must
// not depend on another running at the same time (a nested Split finding every worker busy runs its parts
// on its own caller).
func Split(n int, fn func(part int)) {
	if n <= 1 {
		if n == 1 {
			fn(0)
		}
		return
	}
	j := &job{fn: fn}
	// Parts 1.. go to the workers that can be claimed now; the rest stay with the caller.
	next := 1
	for _, w := range workers(n) {
		if next == n {
			break
		}
		if !w.busy.CompareAndSwap(false, true) {
			continue
		}
		j.pending.Add(1)
		w.slot.Store(&assignment{job: j, part: next})
		if w.sleeping.CompareAndSwap(true, false) {
			w.wake <- struct{}{}
		}
		next++
	}
	fn(0)
	for part := next; part < n; part++ {
		fn(part)
	}
	for polls := 1; j.pending.Load() != 0; polls++ {
		if polls%yieldEvery == 0 {
			runtime.Gosched()
		}
	}
}

// loop runs the parts handed to w, spinning between them for spinWindow and then sleeping until woken.
func (w *worker) loop() {
	for {
		a := w.await()
		a.job.fn(a.part)
		// Free the worker before the caller can see its part done, so that the caller's next Split, which
		// may follow at once, finds it idle.
		w.slot.Store(nil)
		w.busy.Store(false)
		a.job.pending.Add(-1)
	}
}

// await returns w's next part: it polls the slot, yielding now and then, and after spinWindow without one
// sleeps until a Split wakes it.
func (w *worker) await() *assignment {
	start := time.Now()
	for polls := 1; ; polls++ {
		if a := w.slot.Load(); a != nil {
			return a
		}
		if polls%yieldEvery != 0 {
			continue
		}
		runtime.Gosched()
		if time.Since(start) < spinWindow {
			continue
		}
		w.sleeping.Store(true)
		if w.slot.Load() != nil && w.sleeping.CompareAndSwap(true, false) {
			continue // handed a part while going to sleep, and the Split did not see it asleep
		}
		if w.slot.Load() == nil || !w.sleeping.Load() {
			<-w.wake
		}
		start, polls = time.Now(), 0
	}
}
