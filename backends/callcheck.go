package backends

import (
	"fmt"
	"strings"
)

// WithCallChecks makes the Communicator verify, before every collective, that every rank is calling the
// same operation with the same element type, length and root (see SetCallChecks).
func WithCallChecks() CommunicatorOption { return func(c *Communicator) { c.checkCalls = true } }

// SetCallChecks turns the verification of every collective on or off. With it on, each collective is
// preceded by a small all-gather of what every rank is about to call, and ranks that disagree (a rank
// broadcasting while another gathers, buffers of other lengths, another root) get a *MismatchError on every
// rank instead of garbage, MPI_ERR_TRUNCATE or a hang. It costs one extra round trip per collective and
// breaks the overlap of asynchronous all-reduces, so it is for debugging.
func (c *Communicator) SetCallChecks(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checkCalls = on
}

// CallChecks reports whether every collective is verified.
func (c *Communicator) CallChecks() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checkCalls
}

// MismatchError says that the ranks did not all call the same collective: Calls describes each group of
// ranks that called the same thing.
type MismatchError struct {
	Calls   []RankCalls
	Context string // what the caller was doing (for example "optimizer step 12"), when known.
}

// RankCalls is one collective call and the ranks that made it.
type RankCalls struct {
	Ranks []int
	Call  string
}

func (e *MismatchError) Error() string {
	parts := make([]string, len(e.Calls))
	for i, c := range e.Calls {
		ranks := make([]string, len(c.Ranks))
		for j, r := range c.Ranks {
			ranks[j] = fmt.Sprint(r)
		}
		who := "rank " + ranks[0]
		if len(ranks) > 1 {
			who = "ranks " + strings.Join(ranks, ", ")
		}
		parts[i] = fmt.Sprintf("%s called %s", who, c.Call)
	}
	where := ""
	if e.Context != "" {
		where = " during " + e.Context
	}
	return fmt.Sprintf("backends: the ranks called different collectives%s: %s", where, strings.Join(parts, "; "))
}

// callRecord is what a rank is about to call, as exchanged by checkCall.
type callRecord [4]int64

func (r callRecord) String() string {
	op := Op(r[0])
	switch op {
	case OpBarrier:
		return "barrier"
	case OpBroadcast:
		return fmt.Sprintf("broadcast of %s[%d] from root %d", ElementKind(r[1]), r[2], r[3])
	}
	return fmt.Sprintf("%s of %s[%d]", op, ElementKind(r[1]), r[2])
}

// callOf is the record of a collective: its operation, this rank's buffer (the block it contributes) and
// the root of a broadcast (-1 otherwise). Every collective carries one, so that an engine's error can say
// what this rank called ("all-gather of uint8[2048]") even when call checks are off.
func callOf(op Op, bi Buffer, root int) callRecord {
	if op == OpBarrier {
		return callRecord{int64(op), 0, 0, 0}
	}
	return callRecord{int64(op), int64(bi.Kind), int64(bi.Len), int64(root)}
}

// op is the record's operation.
func (r callRecord) op() Op { return Op(r[0]) }

// checkCall verifies, when call checks are on, that every rank is about to call the same collective.
func (c *Communicator) checkCall(op Op, bi Buffer, root int) error {
	if !c.CallChecks() || c.Size() == 1 {
		return nil
	}
	mine := callOf(op, bi, root)
	all := make([]int64, len(mine)*c.Size())
	send := BufferOf(mine[:])
	p, err := c.startAs(callOf(OpAllGather, send, -1), send.Bytes, false, func() (Request, error) { return c.engine.StartAllGather(send, BufferOf(all)) })
	if err != nil {
		return err
	}
	if err := p.Wait(); err != nil {
		return fmt.Errorf("backends: checking that every rank calls %s: %w", mine, err)
	}
	var groups []RankCalls
	for r := range c.Size() {
		var rec callRecord
		copy(rec[:], all[r*len(rec):])
		call := rec.String()
		found := false
		for g := range groups {
			if groups[g].Call == call {
				groups[g].Ranks = append(groups[g].Ranks, r)
				found = true
			}
		}
		if !found {
			groups = append(groups, RankCalls{Ranks: []int{r}, Call: call})
		}
	}
	if len(groups) == 1 {
		return nil
	}
	merr := &MismatchError{Calls: groups}
	c.mu.Lock()
	if c.describe != nil {
		merr.Context = c.describe()
	}
	c.mu.Unlock()
	return merr
}
