package backends

import (
	"errors"
	"fmt"
	"os"
	"sync"
)

func init() {
	RegisterEngine("single", func(topo Topology) (Engine, error) {
		if topo.WorldSize != 1 {
			return nil, fmt.Errorf("backends: engine \"single\" cannot serve a world of %d ranks", topo.WorldSize)
		}
		return singleEngine{}, nil
	})
}

// singleEngine is world size 1: a sum over one rank is the buffer itself, and there is nobody to wait for.
type singleEngine struct{}

func (singleEngine) Rank() int { return 0 }
func (singleEngine) Size() int { return 1 }
func (singleEngine) StartAllReduceSum(buf any) (Request, error) {
	_, err := Elements(buf)
	return doneRequest{}, err
}
func (singleEngine) StartBroadcast(buf any, root int) (Request, error) {
	_, err := Elements(buf)
	return doneRequest{}, err
}
func (singleEngine) StartAllGather(send, recv any) (Request, error) {
	return doneRequest{}, copyInto(recv, send)
}
func (singleEngine) StartBarrier() (Request, error) { return doneRequest{}, nil }
func (singleEngine) Abort(code int)                 { os.Exit(code) }
func (singleEngine) Close() error                   { return nil }

// NewSingle returns a Communicator for a world of one process.
func NewSingle() *Communicator { return NewCommunicator("single", singleEngine{}) }

// ErrAborted is what in-process ranks see after one of them called Abort.
var ErrAborted = errors.New("backends: in-process group aborted")

// inProcessGroup is the shared state of N goroutine ranks. Collectives are matched by their sequence
// number on each rank, as MPI matches them by call order; the last rank to arrive performs the operation
// for everybody, summing in rank order so that every rank gets bitwise the same result.
type inProcessGroup struct {
	size    int
	mu      sync.Mutex
	slots   map[int]*inProcessSlot
	aborted bool
}

type inProcessSlot struct {
	op      Op
	root    int
	bufs    []any // per rank: the buffer (all-reduce, broadcast) or send buffer (all-gather)
	recvs   []any // per rank: all-gather receive buffers
	arrived int
	done    chan struct{}
	err     error
}

// NewInProcessGroup returns size Communicators, one per rank, connected through shared memory. Each must
// be used from its own goroutine, exactly as each MPI rank is its own process.
func NewInProcessGroup(size int, opts ...CommunicatorOption) ([]*Communicator, error) {
	if size < 1 {
		return nil, fmt.Errorf("backends: in-process group needs at least one rank, got %d", size)
	}
	g := &inProcessGroup{size: size, slots: map[int]*inProcessSlot{}}
	comms := make([]*Communicator, size)
	for r := range size {
		comms[r] = NewCommunicator("inprocess", &inProcessEngine{group: g, rank: r}, opts...)
	}
	return comms, nil
}

type inProcessEngine struct {
	group  *inProcessGroup
	rank   int
	seq    int
	closed bool
}

type inProcessRequest struct{ slot *inProcessSlot }

func (r inProcessRequest) Test() (bool, error) {
	select {
	case <-r.slot.done:
		return true, r.slot.err
	default:
		return false, nil
	}
}

func (e *inProcessEngine) Rank() int { return e.rank }
func (e *inProcessEngine) Size() int { return e.group.size }

func (e *inProcessEngine) post(op Op, root int, buf, recv any) (Request, error) {
	if e.closed {
		return nil, ErrClosed
	}
	g := e.group
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.aborted {
		return nil, ErrAborted
	}
	seq := e.seq
	e.seq++
	slot, ok := g.slots[seq]
	if !ok {
		slot = &inProcessSlot{op: op, root: root, bufs: make([]any, g.size), recvs: make([]any, g.size),
			done: make(chan struct{})}
		g.slots[seq] = slot
	}
	if slot.op != op || slot.root != root {
		slot.err = fmt.Errorf("collective #%d: rank %d called %s (root %d) while another rank called %s (root %d)",
			seq, e.rank, op, root, slot.op, slot.root)
	}
	slot.bufs[e.rank], slot.recvs[e.rank] = buf, recv
	slot.arrived++
	if slot.arrived == g.size {
		delete(g.slots, seq)
		if slot.err == nil {
			slot.err = slot.run()
		}
		close(slot.done)
	}
	return inProcessRequest{slot}, nil
}

// run performs the collective once every rank's buffer is known.
func (s *inProcessSlot) run() error {
	switch s.op {
	case OpAllReduce:
		sum := cloneBuffer(s.bufs[0])
		if sum == nil {
			_, err := Elements(s.bufs[0])
			return err
		}
		for r := 1; r < len(s.bufs); r++ {
			if err := sumInto(sum, s.bufs[r]); err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
		}
		for r := range s.bufs {
			if err := copyInto(s.bufs[r], sum); err != nil {
				return err
			}
		}
	case OpBroadcast:
		for r := range s.bufs {
			if r != s.root {
				if err := copyInto(s.bufs[r], s.bufs[s.root]); err != nil {
					return fmt.Errorf("rank %d: %w", r, err)
				}
			}
		}
	case OpAllGather:
		for r, recv := range s.recvs {
			ri, err := Elements(recv)
			if err != nil {
				return err
			}
			chunk := ri.Len / len(s.bufs)
			for src, send := range s.bufs {
				if err := copyInto(sliceOf(recv, src*chunk, (src+1)*chunk), send); err != nil {
					return fmt.Errorf("rank %d gathering from rank %d: %w", r, src, err)
				}
			}
		}
	case OpBarrier:
	}
	return nil
}

func (e *inProcessEngine) StartAllReduceSum(buf any) (Request, error) {
	return e.post(OpAllReduce, 0, buf, nil)
}
func (e *inProcessEngine) StartBroadcast(buf any, root int) (Request, error) {
	return e.post(OpBroadcast, root, buf, nil)
}
func (e *inProcessEngine) StartAllGather(send, recv any) (Request, error) {
	return e.post(OpAllGather, 0, send, recv)
}
func (e *inProcessEngine) StartBarrier() (Request, error) { return e.post(OpBarrier, 0, nil, nil) }

// Abort fails every pending and future collective of the group: the goroutine ranks are in this process, so
// exiting would take the test down with them.
func (e *inProcessEngine) Abort(int) {
	g := e.group
	g.mu.Lock()
	defer g.mu.Unlock()
	g.aborted = true
	for seq, slot := range g.slots {
		slot.err = ErrAborted
		close(slot.done)
		delete(g.slots, seq)
	}
}

func (e *inProcessEngine) Close() error {
	e.closed = true
	return nil
}

func cloneBuffer(buf any) any {
	switch b := buf.(type) {
	case []float32:
		return append([]float32(nil), b...)
	case []float64:
		return append([]float64(nil), b...)
	case []int32:
		return append([]int32(nil), b...)
	case []int64:
		return append([]int64(nil), b...)
	case []byte:
		return append([]byte(nil), b...)
	}
	return nil
}

func sliceOf(buf any, from, to int) any {
	switch b := buf.(type) {
	case []float32:
		return b[from:to]
	case []float64:
		return b[from:to]
	case []int32:
		return b[from:to]
	case []int64:
		return b[from:to]
	case []byte:
		return b[from:to]
	}
	return nil
}
