package backends

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"time"
)

// failureGrace is how long a failing rank waits, before it aborts the job, for the other ranks to learn
// of the failure and report their own errors: aborting ends every process of the job at once, and a rank
// killed before it printed why it stopped leaves the user guessing.
const failureGrace = 3 * time.Second

// closedPeerGrace is how long a rank waiting in a collective keeps waiting after a peer announced that it
// closes: the peer may have completed its side of this very collective just before closing, and the last
// bytes it sent are still arriving. A peer that closed without joining never completes it.
const closedPeerGrace = 2 * time.Second

// The first byte of a notice says what it announces.
const (
	noticeClosing = 'C'
	noticeFailed  = 'F'
)

// maxNoticeText bounds the error text a failing rank sends: enough for any error message, small enough
// for the side channel's eager path.
const maxNoticeText = 4096

// PeerError says that another rank left the job — it failed, or it closed its communicator — while this
// rank still needed it in a collective. The collective can never complete, so this rank stops waiting.
type PeerError struct {
	// Rank is the rank that left; Self is this rank.
	Rank, Self int
	// Failed: the rank reported a failure, whose text is Message. Otherwise it closed its communicator,
	// which means its program ended, or returned an error it did not report through Fail.
	Failed  bool
	Message string
	// Waiting is what this rank was doing: a collective ("all-gather", …) or "close".
	Waiting string
	// Context is what the caller was doing (for example "optimizer step 12"), when known.
	Context string
	// SelfSeq is the number of the collective this rank waits in; PeerSeq that of the collective the failed
	// rank's error names (a *CollectiveError), 0 when it names none.
	SelfSeq, PeerSeq int64
}

// collectiveNumber reads the number of a *CollectiveError's collective from its text, 0 if none.
func collectiveNumber(message string) int64 {
	m := collectiveNumberText.FindStringSubmatch(message)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

var collectiveNumberText = regexp.MustCompile(`collective #(\d+) \(`)

func (e *PeerError) Error() string {
	where := e.Waiting
	if e.SelfSeq > 0 {
		where += fmt.Sprintf(" (its collective #%d)", e.SelfSeq)
	}
	if e.Context != "" {
		where += " during " + e.Context
	}
	if e.Failed {
		step := ""
		switch {
		case e.PeerSeq == 0 || e.SelfSeq == 0:
		case e.PeerSeq != e.SelfSeq:
			step = fmt.Sprintf("; rank %d failed in its collective #%d, rank %d is at #%d: one of them made "+
				"collective calls the other did not (an extra SaveState or evaluation, another number of epochs or "+
				"batches)", e.Rank, e.PeerSeq, e.Self, e.SelfSeq)
		default:
			step = fmt.Sprintf("; both are at collective #%d: they called different collectives there", e.SelfSeq)
		}
		return fmt.Sprintf("backends: rank %d failed: %s (rank %d stopped waiting for it in %s)%s", e.Rank,
			e.Message, e.Self, where, step)
	}
	return fmt.Sprintf("backends: rank %d closed its communicator (its program ended, or stopped on an error "+
		"that rank %d does not know) while rank %d waits for it in %s", e.Rank, e.Rank, e.Self, where)
}

// Fail tells every other rank that this rank failed with err: ranks waiting for it in a collective stop
// with a *PeerError that names this rank and carries err's text, instead of waiting until their timeout.
// The communicator is unusable afterwards, and Close aborts the job. Fail(nil) does nothing.
func (c *Communicator) Fail(err error) {
	if err == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken == nil {
		c.broken = fmt.Errorf("backends: rank %d failed: %w", c.engine.Rank(), err)
	}
	c.announce(noticeFailed, err.Error())
}

// announce sends this rank's one announcement to the others. Call it with c.mu held.
func (c *Communicator) announce(kind byte, text string) {
	if c.notices == nil || c.announced {
		return
	}
	c.announced = true
	if len(text) > maxNoticeText {
		text = text[:maxNoticeText] + "…"
	}
	// A failed send leaves the others to their watchdog, which is all that can be done.
	_ = c.notices.Notify(append([]byte{kind}, text...))
}

// receiveNotices records the announcements that arrived. Call it with c.mu held.
func (c *Communicator) receiveNotices(now time.Time) error {
	notices, err := c.notices.Notices()
	if err != nil {
		return fmt.Errorf("backends: reading other ranks' notices: %w", err)
	}
	for _, n := range notices {
		if _, known := c.left[n.From]; known || len(n.Msg) == 0 {
			continue
		}
		c.left[n.From] = departure{failed: n.Msg[0] == noticeFailed, message: string(n.Msg[1:]), seen: now}
	}
	return nil
}

// departed returns the ranks that announced their departure, in order.
func (c *Communicator) departed() []int {
	ranks := make([]int, 0, len(c.left))
	for r := range c.left {
		ranks = append(ranks, r)
	}
	sort.Ints(ranks)
	return ranks
}

// checkPeers returns a *PeerError when a rank this one waits for in op has left the job: it failed, or it
// closed longer than closedPeerGrace ago.
func (c *Communicator) checkPeers(waiting string, seq int64, now time.Time) error {
	if c.notices == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.receiveNotices(now); err != nil {
		return err
	}
	ranks := c.departed()
	for _, closedOK := range []bool{false, true} {
		for _, r := range ranks {
			d := c.left[r]
			if d.failed == closedOK || (closedOK && now.Sub(d.seen) < closedPeerGrace) {
				continue
			}
			perr := &PeerError{Rank: r, Self: c.engine.Rank(), Failed: d.failed, Message: d.message, Waiting: waiting,
				SelfSeq: seq, PeerSeq: collectiveNumber(d.message)}
			if c.describe != nil {
				perr.Context = c.describe()
			}
			return perr
		}
	}
	return nil
}

// closeTogether is a healthy rank's side of a collective Close: announce, then wait until every other
// rank announced too. A rank that failed meanwhile, or the timeout, makes it return an error instead.
func (c *Communicator) closeTogether() error {
	c.mu.Lock()
	c.announce(noticeClosing, "")
	c.mu.Unlock()
	begin := time.Now()
	var sleep time.Duration
	for {
		now := time.Now()
		c.mu.Lock()
		err := c.receiveNotices(now)
		all := len(c.left) == c.engine.Size()-1
		c.mu.Unlock()
		if err != nil {
			return err
		}
		for _, r := range c.departed() {
			if d := c.left[r]; d.failed {
				return &PeerError{Rank: r, Self: c.engine.Rank(), Failed: true, Message: d.message, Waiting: "close"}
			}
		}
		if all {
			return nil
		}
		if now.Sub(begin) > c.timeout {
			return &TimeoutError{Op: OpBarrier, After: c.timeout, Rank: c.engine.Rank(),
				Context: "closing: other ranks never closed"}
		}
		sleep = min(max(sleep*2, 10*time.Microsecond), 5*time.Millisecond)
		time.Sleep(sleep)
	}
}

// abortAfterGrace tells the other ranks that this rank failed with cause, waits for them to learn of it
// (see failureGrace), and aborts the job. The rank where the failure started aborts as soon as every rank
// announced its own departure; a rank that only reacts to another's failure waits the whole grace, so
// that the job ends with the abort of the rank that failed first, which is the one the launcher names.
func (c *Communicator) abortAfterGrace(cause error) {
	if c.notices != nil {
		c.mu.Lock()
		c.announce(noticeFailed, cause.Error())
		c.mu.Unlock()
		origin := !errors.As(cause, new(*PeerError))
		deadline := time.Now().Add(failureGrace)
		for time.Now().Before(deadline) {
			c.mu.Lock()
			err := c.receiveNotices(time.Now())
			all := len(c.left) == c.engine.Size()-1
			c.mu.Unlock()
			if err != nil || (origin && all) {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	c.engine.Abort(1)
}
