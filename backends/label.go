package backends

import (
	"fmt"
	"time"

	"github.com/goaccel/goaccel/internal/jobenv"
)

// Label says what a collective is for, in the words of the code that starts it ("bucket 3 (8.0 MiB)"):
// the call alone ("all-reduce of float32[2097152]") does not say which of a model's buckets a rank waits
// for. Hang reports (Activity) and timelines show it beside the call. A Label is a plain value, so that
// setting one costs no allocation.
type Label struct {
	// What names the kind of thing the collective carries, as a constant ("bucket"); empty: no label.
	What string
	// Index numbers it among its kind (negative: no number), and Bytes is its size (0: not said).
	Index int
	Bytes int64
}

// BucketLabel labels the collective that carries gradient bucket index of bytes bytes.
func BucketLabel(index int, bytes int64) Label {
	return Label{What: "bucket", Index: index, Bytes: bytes}
}

// IsZero reports whether l is no label.
func (l Label) IsZero() bool { return l.What == "" }

// String is "bucket 3 (8.0 MiB)", "" for no label.
func (l Label) String() string {
	if l.IsZero() {
		return ""
	}
	s := l.What
	if l.Index >= 0 {
		s = fmt.Sprintf("%s %d", s, l.Index)
	}
	if l.Bytes > 0 {
		s += " (" + jobenv.Bytes(l.Bytes) + ")"
	}
	return s
}

// SetNextLabel labels the next collective this communicator starts: the reducer labels each bucket's
// before its comm hook starts it, so that a hook written against the plain calls still carries the
// label. Collectives issued meanwhile by the call checks (SetCallChecks) or by a SetBeforeCollective
// function do not take it; a label no collective took is replaced by the next SetNextLabel. Labels are for
// collectives issued from one goroutine: from several, the next collective may be another goroutine's.
func (c *Communicator) SetNextLabel(l Label) {
	c.mu.Lock()
	c.nextLabel = l
	c.mu.Unlock()
}

// CollectiveRecord is one collective as this rank saw it: started, waited for, and ended (completed, or
// failed). A timeline draws the collective from Started to Ended and the wait from WaitBegan to Ended.
type CollectiveRecord struct {
	// Seq is the collective's number on this rank, from 1; Op, Bytes and Label as in Activity.
	Seq   int64
	Op    Op
	Bytes int
	Label Label
	// Started is when the collective started, WaitBegan when this rank began to wait for it, Ended when
	// the wait ended.
	Started, WaitBegan, Ended time.Time
	// Failed: the wait ended without the collective completing (the engine failed it).
	Failed bool
	call   callRecord
}

// Call is what this rank called ("all-reduce of float32[2097152]").
func (r CollectiveRecord) Call() string { return r.call.String() }

// SetObserver installs fn, which is told of every collective once its first wait ends, on the goroutine
// that waited and outside the communicator's lock: what a timeline records. It must be quick and must not
// issue collectives. It costs one atomic load per wait when unset. nil removes it.
func (c *Communicator) SetObserver(fn func(CollectiveRecord)) {
	if fn == nil {
		c.observer.Store(nil)
		return
	}
	c.observer.Store(&fn)
}

// observe tells the observer, if any, of p's end at end.
func (c *Communicator) observe(p *Pending, waitBegan, end time.Time, failed bool) {
	fn := c.observer.Load()
	if fn == nil {
		return
	}
	(*fn)(CollectiveRecord{Seq: p.seq, Op: p.op, Bytes: p.bytes, Label: p.label, Started: p.started,
		WaitBegan: waitBegan, Ended: end, Failed: failed, call: p.call})
}
