package backends

import "time"

// Activity is where a rank stands in the job's collectives: its latest collective, and the one it waits
// in, if any. A hang report prints it: ranks that wait in collective #118 while another rank's latest is
// #117 show that this other rank has not arrived.
type Activity struct {
	// Seq is the number of the latest collective this rank started, from 1 (0: none yet); Call is what it
	// called there ("all-reduce of float32[2097152]"), Bytes its share and Started when.
	Seq     int64
	Call    string
	Op      Op
	Bytes   int
	Started time.Time
	// Label is what the latest collective is for ("bucket 3 (8.0 MiB)"; zero: not said), WaitLabel the
	// waited one's (see SetNextLabel).
	Label     Label
	WaitLabel Label
	// Waiting: this rank waits in collective WaitSeq (WaitCall, WaitBytes) since WaitBegan. After the wait
	// ended, the Wait fields describe the last wait and WaitEnded says when it ended. A wait that ended
	// without the collective completing says why: TimedOut, it ran past the timeout; Abandoned, another
	// rank failed or left, or the engine failed it. For the job such a rank is still at WaitSeq.
	Waiting   bool
	TimedOut  bool
	Abandoned bool
	WaitSeq   int64
	WaitCall  string
	WaitOp    Op
	WaitBytes int
	WaitBegan time.Time
	WaitEnded time.Time
	// Broken is the failure that made the communicator unusable, nil if none.
	Broken error
	// Context is what the owner says it is doing (SetDescriber), empty without a describer.
	Context string
}

// Waited is how long the current wait has lasted at now, or how long the last one lasted.
func (a Activity) Waited(now time.Time) time.Duration {
	switch {
	case a.WaitBegan.IsZero():
		return 0
	case a.Waiting:
		return now.Sub(a.WaitBegan)
	}
	return a.WaitEnded.Sub(a.WaitBegan)
}

// activity is the Communicator's record behind Activity. Its fields are plain values (the call as its
// fixed-size record, not a string), so that keeping it costs no allocation per collective.
type activity struct {
	seq   int64
	call  callRecord
	label Label
	bytes int
	begun time.Time

	waiting   bool
	timedOut  bool
	abandoned bool
	waitSeq   int64
	waitCall  callRecord
	waitLabel Label
	waitBytes int
	waitBegan time.Time
	waitEnded time.Time
}

// started records that collective seq started at now. Call it with c.mu held.
func (a *activity) started(seq int64, call callRecord, label Label, bytes int, now time.Time) {
	a.seq, a.call, a.label, a.bytes, a.begun = seq, call, label, bytes, now
}

// waits records that a wait for p began at now. Call it with c.mu held.
func (a *activity) waits(p *Pending, now time.Time) {
	a.waiting, a.timedOut, a.abandoned = true, false, false
	a.waitSeq, a.waitCall, a.waitLabel, a.waitBytes, a.waitBegan, a.waitEnded = p.seq, p.call, p.label, p.bytes, now, time.Time{}
}

// How a wait ended.
type waitEnd int

const (
	waitCompleted waitEnd = iota
	waitTimedOut
	waitAbandoned // another rank left or failed, or the engine failed the collective
)

// waited records that the wait for p ended at now, as end says. A wait for another collective that began
// meanwhile (from another goroutine) stays the one recorded. Call it with c.mu held.
func (a *activity) waited(p *Pending, now time.Time, end waitEnd) {
	if a.waitSeq != p.seq {
		return
	}
	a.waiting, a.timedOut, a.abandoned, a.waitEnded = false, end == waitTimedOut, end == waitAbandoned, now
}

// Activity returns where this rank stands (see Activity), with the describer's answer. It is cheap and
// safe to call from any goroutine, for example one that answers a signal while the rank waits.
func (c *Communicator) Activity() Activity {
	c.mu.Lock()
	a := c.now
	broken, describe := c.broken, c.describe
	c.mu.Unlock()
	act := Activity{Seq: a.seq, Bytes: a.bytes, Started: a.begun, Waiting: a.waiting, TimedOut: a.timedOut, Abandoned: a.abandoned,
		WaitSeq: a.waitSeq, WaitBytes: a.waitBytes, WaitBegan: a.waitBegan, WaitEnded: a.waitEnded, Broken: broken,
		Label: a.label, WaitLabel: a.waitLabel}
	if a.seq > 0 {
		act.Call, act.Op = a.call.String(), a.call.op()
	}
	if a.waitSeq > 0 {
		act.WaitCall, act.WaitOp = a.waitCall.String(), a.waitCall.op()
	}
	// The describer runs outside the lock: it may read state of the owner that takes its time.
	if describe != nil {
		act.Context = describe()
	}
	return act
}

// SetOnTimeout installs fn, which is told of every collective that runs past the timeout, on the
// goroutine that waited, before Wait returns the error: a hang report written there shows the rank as
// it was when it gave up. nil removes it.
func (c *Communicator) SetOnTimeout(fn func(*TimeoutError)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onTimeout = fn
}

// SetBeforeCollective installs fn, which runs at the start of every collective this rank issues, before
// the collective starts and outside the communicator's lock. fn may issue collectives itself (the same on
// every rank, at the same point): those do not run fn again. It costs one atomic load per collective when
// unset. nil removes it.
func (c *Communicator) SetBeforeCollective(fn func()) {
	if fn == nil {
		c.before.Store(nil)
		return
	}
	c.before.Store(&fn)
}

// beforeCollective runs the SetBeforeCollective function, unless this collective is one it issued.
func (c *Communicator) beforeCollective() {
	fn := c.before.Load()
	if fn == nil || !c.inBefore.CompareAndSwap(false, true) {
		return
	}
	defer c.inBefore.Store(false)
	(*fn)()
}
