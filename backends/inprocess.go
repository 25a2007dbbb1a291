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

func (singleEngine) Rank() int                                   { return 0 }
func (singleEngine) Size() int                                   { return 1 }
func (singleEngine) StartAllReduceSum(Buffer) (Request, error)   { return doneRequest{}, nil }
func (singleEngine) StartBroadcast(Buffer, int) (Request, error) { return doneRequest{}, nil }
func (singleEngine) StartAllGather(send, recv Buffer) (Request, error) {
	return doneRequest{}, copyInto(recv, send)
}
func (singleEngine) StartReduceScatterSum(send, recv Buffer) (Request, error) {
	return doneRequest{}, copyInto(recv, send)
}
func (singleEngine) StartBarrier() (Request, error) { return doneRequest{}, nil }
func (singleEngine) Abort(code int)                 { os.Exit(code) }
func (singleEngine) Close() error                   { return nil }

// NewSingle returns a Communicator for a world of one process.
func NewSingle() *Communicator { return NewCommunicator("single", singleEngine{}) }

// InProcessEngine is the name of the engine of NewInProcessGroup's communicators (Communicator.Name): its
// ranks are goroutines of one process, sharing its memory and cores.
const InProcessEngine = "inprocess"

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
	bufs    []Buffer // per rank: the buffer (all-reduce, broadcast) or send buffer (all-gather, reduce-scatter)
	recvs   []Buffer // per rank: all-gather and reduce-scatter receive buffers
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
		comms[r] = NewCommunicator(InProcessEngine, &inProcessEngine{group: g, rank: r}, opts...)
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

func (e *inProcessEngine) post(op Op, root int, buf, recv Buffer) (Request, error) {
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
		slot = &inProcessSlot{op: op, root: root, bufs: make([]Buffer, g.size), recvs: make([]Buffer, g.size),
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
		sum, err := s.sum(s.bufs)
		if err != nil {
			return err
		}
		for r := range s.bufs {
			if err := copyInto(s.bufs[r], sum); err != nil {
				return err
			}
		}
	case OpReduceScatter:
		sum, err := s.sum(s.bufs)
		if err != nil {
			return err
		}
		for r, recv := range s.recvs {
			if recv.Len*len(s.bufs) != sum.Len {
				return fmt.Errorf("rank %d: reduce-scatter of %d elements into %d per rank", r, sum.Len, recv.Len)
			}
			if err := copyInto(recv, sum.Slice(r*recv.Len, (r+1)*recv.Len)); err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
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
			chunk := recv.Len / len(s.bufs)
			for src, send := range s.bufs {
				if err := copyInto(recv.Slice(src*chunk, (src+1)*chunk), send); err != nil {
					return fmt.Errorf("rank %d gathering from rank %d: %w", r, src, err)
				}
			}
		}
	case OpBarrier:
	}
	return nil
}

// sum adds the ranks' buffers in rank order, so that every rank gets bitwise the same result.
func (s *inProcessSlot) sum(bufs []Buffer) (Buffer, error) {
	sum := cloneBuffer(bufs[0])
	for r := 1; r < len(bufs); r++ {
		if err := sumInto(sum, bufs[r]); err != nil {
			return Buffer{}, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return sum, nil
}

func (e *inProcessEngine) StartAllReduceSum(buf Buffer) (Request, error) {
	return e.post(OpAllReduce, 0, buf, Buffer{})
}
func (e *inProcessEngine) StartReduceScatterSum(send, recv Buffer) (Request, error) {
	return e.post(OpReduceScatter, 0, send, recv)
}
func (e *inProcessEngine) StartBroadcast(buf Buffer, root int) (Request, error) {
	return e.post(OpBroadcast, root, buf, Buffer{})
}
func (e *inProcessEngine) StartAllGather(send, recv Buffer) (Request, error) {
	return e.post(OpAllGather, 0, send, recv)
}
func (e *inProcessEngine) StartBarrier() (Request, error) {
	return e.post(OpBarrier, 0, Buffer{}, Buffer{})
}

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
