package backends

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goaccel/goaccel/backends/internal/sidechannel"
)

// Op names a kind of collective operation.
type Op int

// The collective operations a Communicator counts.
const (
	OpAllReduce Op = iota
	OpBroadcast
	OpAllGather
	OpBarrier
	OpReduceScatter
	numOps
)

var opNames = [...]string{"all-reduce", "broadcast", "all-gather", "barrier", "reduce-scatter"}

func (op Op) String() string {
	if op >= 0 && op < numOps {
		return opNames[op]
	}
	return fmt.Sprintf("Op(%d)", int(op))
}

// OpStats counts one kind of collective: calls started, bytes contributed by this rank, and the time this
// rank spent waiting for the operation to complete.
type OpStats struct {
	Calls int64
	Bytes int64
	Wait  time.Duration
}

// Stats is a snapshot of a Communicator's counters, per operation kind: PerOp[op] for every Op from 0 to
// len(PerOp)-1.
type Stats struct {
	PerOp [numOps]OpStats
}

// Of returns the counters of one operation kind.
func (s Stats) Of(op Op) OpStats { return s.PerOp[op] }

// Calls is the number of collective calls of every kind.
func (s Stats) Calls() int64 {
	var n int64
	for _, o := range s.PerOp {
		n += o.Calls
	}
	return n
}

// Bytes is the number of bytes this rank contributed to collectives of every kind.
func (s Stats) Bytes() int64 {
	var n int64
	for _, o := range s.PerOp {
		n += o.Bytes
	}
	return n
}

// Wait is the time spent waiting for collectives of every kind.
func (s Stats) Wait() time.Duration {
	var d time.Duration
	for _, o := range s.PerOp {
		d += o.Wait
	}
	return d
}

// Sub returns the counters accumulated since prev was taken.
func (s Stats) Sub(prev Stats) Stats {
	var d Stats
	for i := range s.PerOp {
		d.PerOp[i] = OpStats{
			Calls: s.PerOp[i].Calls - prev.PerOp[i].Calls,
			Bytes: s.PerOp[i].Bytes - prev.PerOp[i].Bytes,
			Wait:  s.PerOp[i].Wait - prev.PerOp[i].Wait,
		}
	}
	return d
}

// TimeoutError is returned when a collective does not complete within the Communicator's timeout: some
// rank is dead, stuck, or called a different sequence of collectives.
type TimeoutError struct {
	Op      Op
	Bytes   int
	After   time.Duration
	Rank    int
	Context string // what the caller was doing (for example "optimizer step 12"), when known.
	Seq     int64  // the collective's number on this rank, from 1 (0: unknown)
	// Call is what this rank called ("all-gather of uint8[8]"; empty: unknown): a rank knows only its own.
	Call string
}

func (e *TimeoutError) Error() string {
	where := ""
	if e.Context != "" {
		where = " during " + e.Context
	}
	number := ""
	if e.Seq > 0 {
		number = fmt.Sprintf("collective #%d (", e.Seq)
		where += ")"
	}
	called := ""
	if e.Call != "" {
		called = fmt.Sprintf(" (rank %d was in %s)", e.Rank, e.Call)
	}
	return fmt.Sprintf("backends: rank %d: %s%s of %d bytes%s did not complete within %s: another rank "+
		"failed, hangs, or called a different collective%s", e.Rank, number, e.Op, e.Bytes, where, e.After, called)
}

// ErrClosed is returned by collectives on a closed Communicator.
var ErrClosed = errors.New("backends: communicator is closed")

// DefaultTimeout bounds every collective wait unless WithTimeout says otherwise. It is generous because a
// rank legitimately waits for the slowest rank's compute (data loading, a checkpoint write) inside a
// collective.
const DefaultTimeout = 10 * time.Minute

// TimeoutEnvVar overrides the collective timeout: a Go duration such as "30s", or a number of seconds. A
// value that is neither is an error, never ignored. The Accelerator's configuration reads it (see
// accel.OptionsFromEnv); a Communicator takes only options.
const TimeoutEnvVar = "GOACCEL_COLLECTIVE_TIMEOUT"

// CallChecksEnvVar turns on the verification of every collective (see SetCallChecks) when set to 1, true,
// yes or on (0, false, no or off leave it off; anything else is an error): the debug mode. The Accelerator's configuration reads it (see accel.OptionsFromEnv).
const CallChecksEnvVar = "GOACCEL_DEBUG"

// Communicator runs collectives on an engine and counts them. It is safe for concurrent use; collectives
// themselves must still be issued in the same order on every rank.
type Communicator struct {
	engine     Engine
	engineName string

	mu     sync.Mutex // serialises engine calls: engines need not be thread-safe.
	stats  Stats
	closed bool
	// seq counts the collectives this rank started: ranks in step are at the same number, so the numbers in
	// their errors show where one made a call the other did not.
	seq     int64
	broken  error // set once a collective failed; the job cannot continue consistently.
	timeout time.Duration
	// describe says what the owner is doing, for error messages (for example the optimizer step).
	describe func() string

	// checkCalls: verify before every collective that all ranks call the same one (WithCallChecks).
	checkCalls bool
	// notices is the engine's side channel (nil if it has none); see sidechannel.Messenger.
	notices sidechannel.Messenger
	// announced: this rank told the others it closes or failed (it does so once).
	announced bool
	// left records, per rank, what that rank announced: it closed, or failed and why.
	left map[int]departure
	// polling is what a wait does between two busy polls.
	polling pollMode
	// kernel is what this rank shares its kernel with, as Open found it (zero otherwise).
	kernel KernelShare
	// resched passes the polling goroutine through Go's scheduler (yieldToOwnP; tests count the calls).
	// See reschedEvery.
	resched func()

	// now is where this rank stands, for Activity: kept up to date without allocating, read only when
	// someone asks (a hang report).
	now activity
	// onTimeout is told of every collective timeout before the error returns (SetOnTimeout).
	onTimeout func(*TimeoutError)
	// before runs before every collective (SetBeforeCollective); inBefore keeps it from running again for
	// the collectives it issues itself.
	before   atomic.Pointer[func()]
	inBefore atomic.Bool
	// nextLabel is the label of the next collective started (SetNextLabel); observer is told of every
	// collective's end (SetObserver).
	nextLabel Label
	observer  atomic.Pointer[func(CollectiveRecord)]
}

// KernelShare is what this rank shares its kernel with: the job's ranks on it and the processors their
// affinity masks allow between them, as Open found them by every rank's kernel boot id (containers and
// emulated hosts on one machine included, which a launcher counts as separate nodes). It is zero for a
// communicator Open did not make, a job of one rank, or a rank that could not read its machine.
func (c *Communicator) KernelShare() KernelShare { return c.kernel }

// departure is what a rank announced on its way out of the job.
type departure struct {
	failed  bool
	message string
	seen    time.Time // when this rank received the announcement
}

// CommunicatorOption configures a Communicator.
type CommunicatorOption func(*Communicator)

// WithTimeout bounds how long any one collective may take before it fails with a *TimeoutError.
func WithTimeout(d time.Duration) CommunicatorOption {
	return func(c *Communicator) { c.timeout = d }
}

// NewCommunicator wraps an engine. engineName is what Name reports.
func NewCommunicator(engineName string, engine Engine, opts ...CommunicatorOption) *Communicator {
	c := &Communicator{engine: engine, engineName: engineName, timeout: DefaultTimeout, resched: yieldToOwnP}
	for _, opt := range opts {
		opt(c)
	}
	if m, ok := engine.(sidechannel.Messenger); ok && engine.Size() > 1 {
		c.notices = m
		c.left = map[int]departure{}
	}
	return c
}

// ParseTimeout reads a collective timeout as TimeoutEnvVar gives it: a Go duration ("90s", "10m") or a
// plain number of seconds ("30", "2.5"). It must be positive.
func ParseTimeout(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		secs, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || math.IsNaN(secs) || math.IsInf(secs, 0) {
			return 0, fmt.Errorf("%q is neither a duration (such as 30s or 10m) nor a number of seconds", s)
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q is not a positive duration", s)
	}
	return d, nil
}

// Open opens the named registered engine for topo and wraps it.
func Open(engineName string, topo Topology, opts ...CommunicatorOption) (*Communicator, error) {
	engine, err := OpenEngine(engineName, topo)
	if err != nil {
		return nil, err
	}
	c := NewCommunicator(engineName, engine, opts...)
	c.polling = pollSpinning
	if topo.Oversubscribed() {
		c.polling = pollYieldingThreads
	}
	if c.Size() != topo.WorldSize || c.Rank() != topo.Rank {
		_ = engine.Close()
		return nil, fmt.Errorf("backends: engine %q sees rank %d of %d but the launcher's environment (%s) says "+
			"rank %d of %d", engineName, c.Rank(), c.Size(), topo.Source, topo.Rank, topo.WorldSize)
	}
	if c.Size() > 1 {
		// The launcher's count of ranks per node misses nodes that share a kernel (containers, emulated hosts).
		// Every rank gathers, whatever its own topology says: a collective all ranks must join.
		share, err := kernelShare(engine)
		if err != nil {
			_ = engine.Close()
			return nil, fmt.Errorf("backends: opening engine %q: comparing the ranks' machines: %w", engineName, err)
		}
		c.kernel = share
		if share.Oversubscribed() {
			c.polling = pollYieldingThreads
			if o, ok := engine.(oversubscribable); ok {
				o.SetOversubscribed()
			}
		}
	}
	return c, nil
}

// Name is the engine's registered name.
func (c *Communicator) Name() string { return c.engineName }

// Rank is this process's rank in [0, Size()).
func (c *Communicator) Rank() int { return c.engine.Rank() }

// Size is the number of ranks.
func (c *Communicator) Size() int { return c.engine.Size() }

// Timeout is the bound on each collective wait.
func (c *Communicator) Timeout() time.Duration { return c.timeout }

// SetTimeout changes the bound on each collective wait.
func (c *Communicator) SetTimeout(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timeout = d
}

// SetDescriber installs a function that says what the owner is doing; its answer is added to timeout errors.
func (c *Communicator) SetDescriber(describe func() string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.describe = describe
}

// Stats returns a snapshot of the counters.
func (c *Communicator) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Pending is a collective in flight, returned by the asynchronous calls.
type Pending struct {
	comm    *Communicator
	req     Request
	op      Op
	call    callRecord // what this rank called, for errors
	label   Label      // what it is for (SetNextLabel)
	bytes   int
	seq     int64 // this collective's number on this rank, from 1 (see CollectiveError)
	started time.Time

	// mu guards done and err: Wait may be called from several goroutines, and the second must get the
	// first's result rather than race on it or poll a request the first already completed.
	mu   sync.Mutex
	done bool
	err  error
}

// Wait blocks until the collective completes, the timeout passes, or it fails. Waiting twice is allowed
// and returns the same result, also from another goroutine.
func (p *Pending) Wait() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return p.err
	}
	p.err = p.comm.wait(p)
	p.done = true
	return p.err
}

// Progress lets the engine advance the collective without waiting for it, and reports whether it has
// completed. It is for a goroutine that keeps collectives moving while the program computes (the gradient
// sync that overlaps a backward pass): Open MPI's non-blocking collectives advance only inside MPI calls,
// and a poll there advances every request in flight, not only this one. It polls once, cheaply (an engine
// whose requests have a Poll method is polled with it; see Poller), and leaves the result and any error to
// Wait, which must still be called.
func (p *Pending) Progress() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done {
		return true
	}
	c := p.comm
	c.mu.Lock()
	defer c.mu.Unlock()
	if poller, ok := p.req.(Poller); ok {
		done, err := poller.Poll()
		return done || err != nil
	}
	done, err := p.req.Test()
	return done || err != nil
}

// Poller is a Request that can also be polled once without the time budget its Test may spend (the MPI
// engine's Test polls for up to 200 µs, at the cadence a waiting rank needs; a progress goroutine polling
// while the program computes must not take that much of the core from it). Poll makes the same progress as
// Test, and a later Test reports the same completion.
type Poller interface {
	Poll() (done bool, err error)
}

// start starts the collective call describes, of bytes from this rank, with startFn: a collective the
// caller asked for, which takes the label SetNextLabel gave unless a SetBeforeCollective function issued it.
func (c *Communicator) start(call callRecord, bytes int, startFn func() (Request, error)) (*Pending, error) {
	return c.startAs(call, bytes, !c.inBefore.Load(), startFn)
}

// startAs is start; labelled says whether the collective takes the pending label (the call checks'
// collectives do not).
func (c *Communicator) startAs(call callRecord, bytes int, labelled bool, startFn func() (Request, error)) (*Pending, error) {
	op := call.op()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.broken != nil {
		return nil, fmt.Errorf("backends: communicator unusable after an earlier failure: %w", c.broken)
	}
	// The time is read before the engine starts the collective: on an engine where the last rank's start
	// completes it (in-process), the other ranks may finish waiting before that start returns, and a
	// collective must not look finished somewhere before every rank started it.
	now := time.Now()
	req, err := startFn()
	if err != nil {
		c.broken = err
		return nil, fmt.Errorf("backends: starting %s: %w", op, err)
	}
	c.stats.PerOp[op].Calls++
	c.stats.PerOp[op].Bytes += int64(bytes)
	c.seq++
	var label Label
	if labelled {
		label, c.nextLabel = c.nextLabel, Label{}
	}
	c.now.started(c.seq, call, label, bytes, now)
	return &Pending{comm: c, req: req, op: op, call: call, label: label, bytes: bytes, seq: c.seq, started: now}, nil
}

// busyPollFor is how long a wait polls without sleeping. Engines progress only inside Test (Open MPI's
// non-blocking collectives have no progress thread), so every round of an all-reduce waits for the next
// poll: a sleep there stalls the whole collective (docs/notes.md, Note [busy polling]). Past this, the wait
// is for a peer that is still computing or writing a checkpoint, and sleeping keeps that idle wait from
// burning a core.
const busyPollFor = 20 * time.Millisecond

// reschedEvery is how often a wait that spins passes through Go's scheduler, besides once when it begins.
//
// Go's sysmon preempts a goroutine that ran 10 ms without passing through the scheduler, and one it finds
// inside a cgo call (where an MPI poll spends most of its time) cannot be preempted: sysmon takes its P and
// wakes another thread to run it. A goroutine that goes on spinning never starts a new time slice, so this
// repeats at every cgo call sysmon catches, each time waking a thread that takes a core from a rank
// progressing the same collective. It happens at once, without the 10 ms, when the goroutine comes back from
// a long cgo call (a blocking MPI call, a BLAS kernel) on another P than it left, whose last slice is long
// past. So every wait starts a slice when it begins, and a long one every millisecond: yieldToOwnP is cheap
// and wakes no thread. What it buys is in docs/notes.md, Note [time slices in waits].
const reschedEvery = time.Millisecond

// betweenPolls runs between two busy polls, as the poll mode says; begin is when the wait began, and
// *sliceAt how long into it a time slice was last started (see reschedEvery).
func (c *Communicator) betweenPolls(begin time.Time, sliceAt *time.Duration) {
	switch c.polling {
	case pollYieldingThreads:
		yieldProcessor()
	case pollYieldingGoroutines:
		// Every poll passes through the scheduler already.
		runtime.Gosched()
		return
	}
	// Measured after the yield: on a loaded machine the yield itself can outlast several slices.
	if inWait := time.Since(begin); inWait-*sliceAt >= reschedEvery {
		*sliceAt = inWait
		c.resched()
	}
}

// pollMode is what a waiting rank does between two busy polls.
type pollMode int

const (
	// pollYieldingGoroutines lets other goroutines run: the in-process engine's ranks are goroutines of
	// one process, and the peers a rank waits for must get a turn.
	pollYieldingGoroutines pollMode = iota
	// pollYieldingThreads hands the processor to any thread of any process: ranks outnumbering their node's
	// cores must, or a polling rank starves the peer it waits for.
	pollYieldingThreads
	// pollSpinning polls again at once: each rank of the node has a core, as Open MPI assumes when it is
	// not oversubscribed. Yielding there costs bandwidth: a yield is a system call that can hand the core
	// to an unrelated process while the peer is sending, and even a goroutine yield enters the scheduler
	// (docs/notes.md, Note [poll modes]).
	pollSpinning
)

// wait polls the request: engines progress inside Test, and polling (rather than a blocking engine call)
// lets the watchdog fire on a hung peer. Between polls it lets others run (betweenPolls), then backs off to
// short sleeps after busyPollFor.
func (c *Communicator) wait(p *Pending) error {
	begin := time.Now()
	// A new time slice for the wait (see reschedEvery): collectives that complete at their first poll never
	// reach betweenPolls, and a loop of them would otherwise never pass through the scheduler.
	if c.polling != pollYieldingGoroutines {
		c.resched()
	}
	var sliceAt time.Duration
	c.mu.Lock()
	c.now.waits(p, begin)
	c.mu.Unlock()
	deadline := p.started.Add(c.timeout)
	var sleep time.Duration
	for {
		c.mu.Lock()
		done, err := p.req.Test()
		c.mu.Unlock()
		if done || err != nil {
			c.mu.Lock()
			c.stats.PerOp[p.op].Wait += time.Since(begin)
			end := waitCompleted
			if err != nil {
				end = waitAbandoned
			}
			ended := time.Now()
			c.now.waited(p, ended, end)
			if err != nil {
				c.broken = err
			}
			c.mu.Unlock()
			c.observe(p, begin, ended, err != nil)
			if err != nil {
				cerr := &CollectiveError{Op: p.op, Bytes: p.bytes, Seq: p.seq, Call: p.call.String(), Rank: c.engine.Rank(), Err: err}
				c.mu.Lock()
				if c.describe != nil {
					cerr.Context = c.describe()
				}
				c.mu.Unlock()
				return cerr
			}
			return nil
		}
		now := time.Now()
		if now.Sub(begin) >= busyPollFor {
			// Past the busy phase the wait is long enough to be for a peer that may have left the job: a
			// peer that failed or closed can never join this collective.
			if err := c.checkPeers(p.op.String(), p.seq, now); err != nil {
				c.mu.Lock()
				c.broken = err
				c.stats.PerOp[p.op].Wait += time.Since(begin)
				c.now.waited(p, time.Now(), waitAbandoned)
				c.mu.Unlock()
				return err
			}
		}
		if now.After(deadline) {
			c.mu.Lock()
			terr := &TimeoutError{Op: p.op, Bytes: p.bytes, After: c.timeout, Rank: c.engine.Rank(), Seq: p.seq,
				Call: p.call.String()}
			if c.describe != nil {
				terr.Context = c.describe()
			}
			c.broken = terr
			c.stats.PerOp[p.op].Wait += time.Since(begin)
			c.now.waited(p, time.Now(), waitTimedOut)
			onTimeout := c.onTimeout
			c.mu.Unlock()
			if onTimeout != nil {
				onTimeout(terr)
			}
			return terr
		}
		if now.Sub(begin) < busyPollFor {
			c.betweenPolls(begin, &sliceAt)
			continue
		}
		sleep = min(max(sleep*2, 10*time.Microsecond), time.Millisecond)
		time.Sleep(sleep)
	}
}

// AllReduceSumAsync starts an in-place sum of b across ranks (BufferOf(slice) makes b of a slice); its
// memory must not be touched until Wait returns.
func (c *Communicator) AllReduceSumAsync(b Buffer) (*Pending, error) {
	c.beforeCollective()
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := c.checkCall(OpAllReduce, b, -1); err != nil {
		return nil, err
	}
	return c.start(callOf(OpAllReduce, b, -1), b.Bytes, func() (Request, error) { return c.engine.StartAllReduceSum(b) })
}

// AllReduceSum sums buf in place across ranks.
func (c *Communicator) AllReduceSum(b Buffer) error {
	p, err := c.AllReduceSumAsync(b)
	if err != nil {
		return err
	}
	return p.Wait()
}

// ReduceScatterSumAsync starts an element-wise sum of every rank's send that leaves this rank's block of it
// in recv: send is Size() blocks of len(recv) elements, and rank r receives the sum of block r. Neither
// buffer may be touched until Wait returns.
func (c *Communicator) ReduceScatterSumAsync(send, recv Buffer) (*Pending, error) {
	c.beforeCollective()
	s, r, err := c.blocks("reduce-scatter", recv, send)
	if err != nil {
		return nil, err
	}
	if err := c.checkCall(OpReduceScatter, s, -1); err != nil {
		return nil, err
	}
	return c.start(callOf(OpReduceScatter, s, -1), s.Bytes, func() (Request, error) { return c.engine.StartReduceScatterSum(s, r) })
}

// ReduceScatterSum is ReduceScatterSumAsync and Wait.
func (c *Communicator) ReduceScatterSum(send, recv Buffer) error {
	p, err := c.ReduceScatterSumAsync(send, recv)
	if err != nil {
		return err
	}
	return p.Wait()
}

// blocks classifies a buffer of one block and one of Size() blocks, and checks that they match.
func (c *Communicator) blocks(what string, block, whole Buffer) (Buffer, Buffer, error) {
	if err := block.check(); err != nil {
		return whole, block, err
	}
	if err := whole.check(); err != nil {
		return whole, block, err
	}
	if block.Kind != whole.Kind || whole.Len != block.Len*c.Size() {
		return whole, block, fmt.Errorf("backends: %s of %s[%d] per rank over %d ranks needs a %s[%d] buffer "+
			"of all ranks' blocks, got %s[%d]", what, block.Kind, block.Len, c.Size(), block.Kind,
			block.Len*c.Size(), whole.Kind, whole.Len)
	}
	return whole, block, nil
}

// Broadcast copies root's buf into every rank's buf.
func (c *Communicator) Broadcast(b Buffer, root int) error {
	c.beforeCollective()
	if err := b.check(); err != nil {
		return err
	}
	if root < 0 || root >= c.Size() {
		return fmt.Errorf("backends: broadcast root %d outside [0, %d)", root, c.Size())
	}
	if err := c.checkCall(OpBroadcast, b, root); err != nil {
		return err
	}
	p, err := c.start(callOf(OpBroadcast, b, root), b.Bytes, func() (Request, error) { return c.engine.StartBroadcast(b, root) })
	if err != nil {
		return err
	}
	return p.Wait()
}

// AllGatherAsync starts gathering every rank's send into recv, ordered by rank. len(recv) must be
// Size()*len(send). Neither buffer may be touched until Wait returns.
func (c *Communicator) AllGatherAsync(send, recv Buffer) (*Pending, error) {
	c.beforeCollective()
	r, s, err := c.blocks("all-gather", send, recv)
	if err != nil {
		return nil, err
	}
	if err := c.checkCall(OpAllGather, s, -1); err != nil {
		return nil, err
	}
	return c.start(callOf(OpAllGather, s, -1), s.Bytes, func() (Request, error) { return c.engine.StartAllGather(s, r) })
}

// AllGather gathers every rank's send into recv, ordered by rank. len(recv) must be Size()*len(send).
func (c *Communicator) AllGather(send, recv Buffer) error {
	p, err := c.AllGatherAsync(send, recv)
	if err != nil {
		return err
	}
	return p.Wait()
}

// Barrier returns once every rank reached it.
func (c *Communicator) Barrier() error {
	c.beforeCollective()
	if err := c.checkCall(OpBarrier, Buffer{}, -1); err != nil {
		return err
	}
	p, err := c.start(callOf(OpBarrier, Buffer{}, -1), 0, c.engine.StartBarrier)
	if err != nil {
		return err
	}
	return p.Wait()
}

// Abort ends every rank of the job with the given exit code. Use it when this rank cannot continue: the
// others would otherwise wait in their next collective until the timeout.
func (c *Communicator) Abort(code int) {
	c.engine.Abort(code)
}

// CollectiveError is a collective the engine failed (Open MPI's MPI_ERR_TRUNCATE when the ranks called
// different collectives with buffers of different sizes). It says which of this rank's collectives it was,
// counted from 1, and what this rank called there, so that the ranks' errors side by side show where they
// went out of step and what each called. A rank knows only its own call: the other ranks' are in their own
// errors, and the debug mode (CallChecksEnvVar) compares every rank's call before it is made.
type CollectiveError struct {
	Op    Op
	Bytes int
	Seq   int64
	// Call is what this rank called: "all-gather of uint8[2048]", "broadcast of float32[10] from root 0",
	// "barrier" (empty: unknown, and Op and Bytes say it).
	Call string
	// Rank is this rank.
	Rank    int
	Context string // what the caller was doing (for example "saving state"), when known
	Err     error
}

func (e *CollectiveError) Error() string {
	call := e.Call
	if call == "" {
		call = fmt.Sprintf("%s of %d bytes", e.Op, e.Bytes)
	}
	where := ""
	if e.Context != "" {
		where = " during " + e.Context
	}
	return fmt.Sprintf("backends: collective #%d (%s%s) failed on rank %d: %v; the ranks may have called "+
		"different collectives here (rank %d was in %s; the other ranks' errors say what each called, "+
		"compare their collective numbers; %s=1 compares every call before it is made)", e.Seq, call, where,
		e.Rank, e.Err, e.Rank, call, CallChecksEnvVar)
}

func (e *CollectiveError) Unwrap() error { return e.Err }

// Closed reports whether Close was called: objects that share the Communicator (a prepared model and
// optimizer) refuse to run after it, rather than computing on a job that has ended.
func (c *Communicator) Closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close releases the engine. Closing is collective for engines with a side channel (MPI, whose
// MPI_Finalize waits for every rank): this rank announces that it closes and waits until every other rank
// announced it closes too. A rank still waiting in a collective learns of the announcement and fails with a
// *PeerError instead of waiting for a rank that will never join, so a rank that leaves early never hangs
// the job.
//
// After a failed collective (a timeout, an error, a peer that left), or after Fail, the job's ranks are no
// longer in step and a clean shutdown could hang: Close then tells the other ranks that this rank failed,
// gives them a moment (failureGrace) to receive it and report their own errors, and aborts the job. Engines
// whose Abort ends the process (MPI) never return from Close then: report errors before closing.
func (c *Communicator) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	broken := c.broken
	c.mu.Unlock()
	if c.Size() == 1 {
		return c.engine.Close()
	}
	if broken == nil && c.notices != nil {
		broken = c.closeTogether()
	}
	if broken != nil {
		c.abortAfterGrace(broken)
		return errors.Join(fmt.Errorf("backends: rank %d aborted the job after a failure: %w", c.Rank(),
			broken), c.engine.Close())
	}
	return c.engine.Close()
}

// Broken returns the error that made the communicator unusable, or nil.
func (c *Communicator) Broken() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}
