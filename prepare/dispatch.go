package prepare

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	gomlxbackends "github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/backends"
)

// Dispatch makes rank 0 alone read a stream loader's dataset (Accelerate's dispatch_batches): for each
// step it reads one batch per rank and broadcasts them, and every rank keeps its own. Use it for a stream
// that cannot be read on every process — a queue or a socket that hands each item out once, a reader that
// holds a licence or a connection, a generator too costly to run N times. The ranks get exactly the
// batches NewStreamLoader would give them (rank r the r-th batch of each round of N), and batch sizes stay
// per process: each of the stream's batches is one process's batch. Ranks other than 0 may pass a nil
// dataset.
//
// The end of the stream travels in the same message as the last round, so every rank ends the epoch at the
// same step; an incomplete last round is padded, cut or left uneven as EvenBatches and DropLast say, as for
// NewStreamLoader. A read error on rank 0 reaches every rank at the same step too.
//
// Every rank receives the whole round and keeps its own batch, as Accelerate does: N times the bytes of a
// scatter, which the collective engines do not offer. While rank 0 reads, the others wait in the
// broadcast: a read slower than the communicator's timeout fails as a collective would. The loop must go on
// or stop at the same step on every rank — a rank that leaves the loop early stops answering the
// broadcasts. Streams only: an indexable Source is sharded by index with no messages.
func Dispatch() LoaderOption { return func(c *loaderConfig) { c.dispatch = true } }

// Dispatched reports whether rank 0 alone reads the loader's stream (Dispatch).
func (l *DataLoader) Dispatched() bool { return l.cfg.dispatch }

// dispatchedElsewhere stands for the stream on a rank that only receives it.
type dispatchedElsewhere struct{}

func (dispatchedElsewhere) Name() string { return "rank 0's dataset" }
func (dispatchedElsewhere) Reset()       {}
func (dispatchedElsewhere) Yield() (any, []*tensors.Tensor, []*tensors.Tensor, error) {
	return nil, nil, nil, errors.New("prepare: a dispatched stream is read on rank 0 only")
}

// The kinds of message rank 0 broadcasts for each step.
const (
	// msgRound carries a round: its batches (none at the end of an epoch) and the number of batches of the
	// round after it, which rank 0 has already read, so that every rank knows its last batch before that
	// batch's backward pass.
	msgRound byte = iota
	// msgError carries the text of rank 0's error reading the stream.
	msgError
)

// iterateDispatched is iterateStream with rank 0 reading and every rank receiving: one broadcast of the
// message's length and one of the message per step, on every rank, whether or not the round holds a batch
// for it.
func (l *DataLoader) iterateDispatched(yield func(Batch, error) bool) {
	size, rank := l.rt.Comm.Size(), l.rt.Comm.Rank()
	epoch := l.iterEpoch // a SetEpoch inside the loop is for the next iteration
	var reader *roundReader
	if rank == 0 {
		reader = &roundReader{l: l}
	}
	for step := l.firstStep(l.iterStart); ; step++ {
		var msg []byte
		if reader != nil {
			msg = reader.next()
		}
		round, err := l.receiveRound(msg)
		if reader != nil && reader.err != nil {
			err = reader.err // rank 0 keeps its own error, which errors.Is can look into
		}
		if err != nil {
			yield(Batch{}, err)
			return
		}
		if round.count() == 0 || (rank >= round.count() && !l.cfg.evenBatches) {
			return // the end of the epoch, or, without even batches, a last round with nothing for this rank
		}
		batch := Batch{Epoch: epoch, Step: step, ValidPerRank: make([]int, size)}
		for r := range min(size, round.count()) {
			batch.ValidPerRank[r] = round.rows(r)
		}
		batch.Valid = batch.ValidPerRank[rank]
		if reader != nil {
			batch.Inputs, batch.Labels = reader.current[0].inputs, reader.current[0].labels
		} else if batch.Inputs, batch.Labels, err = round.tensors(l.rt.Backend, rank%round.count()); err != nil {
			err = fmt.Errorf("prepare: dispatched batch %d of epoch %d: %w", step, epoch, err)
		}
		// Without even batches a rank with nothing in the next round has its last batch now, and still
		// joins that round's broadcast after it.
		last := round.next == 0 || (!l.cfg.evenBatches && rank >= round.next)
		l.yielded1(last)
		if !yield(batch, err) || err != nil || round.next == 0 {
			return
		}
	}
}

// receiveRound broadcasts rank 0's message (msg, ignored on the other ranks) and decodes it.
func (l *DataLoader) receiveRound(msg []byte) (dispatchedRound, error) {
	comm := l.rt.Comm
	length := []int64{int64(len(msg))}
	if err := comm.Broadcast(backends.BufferOf(length), 0); err != nil {
		return dispatchedRound{}, fmt.Errorf("prepare: receiving dispatched batches: %w", err)
	}
	if comm.Rank() != 0 {
		msg = make([]byte, length[0])
	}
	if err := comm.Broadcast(backends.BufferOf(msg), 0); err != nil {
		return dispatchedRound{}, fmt.Errorf("prepare: receiving dispatched batches: %w", err)
	}
	return decodeRound(msg)
}

// roundReader is rank 0's side: it reads the stream in rounds of N batches, one round ahead of the one it
// sends.
type roundReader struct {
	l                 *DataLoader
	started, eof      bool
	read              int
	current, upcoming []streamBatch
	// err is the error rank 0 sent as text, kept whole for its own loop.
	err error
}

// next reads what the next message needs and encodes it.
func (r *roundReader) next() []byte {
	size := r.l.rt.Comm.Size()
	if !r.started {
		r.started = true
		if err := r.begin(); err != nil {
			return r.fail(err)
		}
		if len(r.upcoming) == 0 && r.l.iterStart == 0 && (r.read == 0 || r.l.cfg.dropLast) {
			return r.fail(fmt.Errorf("prepare: dataset %q yielded %d batch(es), too few for one round of %d rank(s)",
				r.l.stream.Name(), r.read, size))
		}
	}
	r.current = r.upcoming
	r.upcoming = nil
	if len(r.current) > 0 {
		var err error
		if r.upcoming, err = r.readRound(); err != nil {
			return r.fail(err)
		}
	}
	msg, err := encodeRound(r.current, len(r.upcoming))
	if err != nil {
		return r.fail(fmt.Errorf("prepare: sending a batch of dataset %q: %w", r.l.stream.Name(), err))
	}
	return msg
}

// begin starts the stream over and skips the batches the job consumed before its checkpoint: a stream
// cannot seek, so they are read again and dropped.
func (r *roundReader) begin() error {
	r.l.stream.Reset()
	for r.read < r.l.iterStart && !r.eof {
		if _, _, _, err := r.l.stream.Yield(); errors.Is(err, io.EOF) {
			r.eof = true
		} else if err != nil {
			return fmt.Errorf("prepare: reading dataset %q: %w", r.l.stream.Name(), err)
		} else {
			r.read++
		}
	}
	var err error
	r.upcoming, err = r.readRound()
	return err
}

// readRound reads up to N batches; an incomplete round is dropped with DropLast.
func (r *roundReader) readRound() ([]streamBatch, error) {
	size := r.l.rt.Comm.Size()
	var round []streamBatch
	for len(round) < size && !r.eof {
		begin := r.l.rt.beginLoad()
		_, inputs, labels, err := r.l.stream.Yield()
		if errors.Is(err, io.EOF) {
			// train.Dataset only promises Reset after io.EOF: the stream is not asked again.
			r.eof = true
			break
		}
		r.l.rt.observeLoad(begin, inputs)
		if err != nil {
			return nil, fmt.Errorf("prepare: reading dataset %q: %w", r.l.stream.Name(), err)
		}
		r.read++
		round = append(round, streamBatch{inputs, labels})
	}
	if len(round) < size && r.l.cfg.dropLast {
		return nil, nil
	}
	return round, nil
}

func (r *roundReader) fail(err error) []byte {
	r.err = err
	return append([]byte{msgError}, err.Error()...)
}

// encodeRound lays out a round message: the kind, the number of batches and of the next round's, then for
// each batch its number of inputs and labels and each tensor's dtype and dimensions, then every tensor's
// bytes in that order. Bytes whatever the dtype: the engines carry any.
func encodeRound(round []streamBatch, next int) ([]byte, error) {
	msg := []byte{msgRound}
	msg = binary.AppendUvarint(msg, uint64(len(round)))
	msg = binary.AppendUvarint(msg, uint64(next))
	for _, b := range round {
		msg = binary.AppendUvarint(msg, uint64(len(b.inputs)))
		msg = binary.AppendUvarint(msg, uint64(len(b.labels)))
		for i, t := range append(append([]*tensors.Tensor{}, b.inputs...), b.labels...) {
			if t == nil {
				return nil, fmt.Errorf("tensor #%d of a batch is nil", i)
			}
			s := t.Shape()
			msg = binary.AppendUvarint(msg, uint64(s.DType))
			msg = binary.AppendUvarint(msg, uint64(s.Rank()))
			for _, d := range s.Dimensions {
				msg = binary.AppendUvarint(msg, uint64(d))
			}
		}
	}
	for _, b := range round {
		for _, t := range append(append([]*tensors.Tensor{}, b.inputs...), b.labels...) {
			if t.Shape().Size() == 0 {
				continue // GoMLX's byte views need at least one element
			}
			if err := t.ConstBytes(func(data []byte) { msg = append(msg, data...) }); err != nil {
				return nil, err
			}
		}
	}
	return msg, nil
}

// dispatchedRound is a decoded round message.
type dispatchedRound struct {
	batches []dispatchedBatch
	next    int
	data    []byte
}

type dispatchedBatch struct {
	shapes  []shapes.Shape // inputs, then labels
	inputs  int
	offsets []int // of each tensor's bytes in data
}

func (r dispatchedRound) count() int { return len(r.batches) }

// rows is batch j's number of examples (Batch.Size).
func (r dispatchedRound) rows(j int) int {
	b := r.batches[j]
	if b.inputs == 0 || b.shapes[0].Rank() == 0 {
		return 0
	}
	return b.shapes[0].Dimensions[0]
}

// tensors copies batch j's tensors out of the message, into buffers of backend where they are host memory.
func (r dispatchedRound) tensors(backend gomlxbackends.Backend, j int) (inputs, labels []*tensors.Tensor, err error) {
	b := r.batches[j]
	out := make([]*tensors.Tensor, len(b.shapes))
	for i, s := range b.shapes {
		t, dst, err := newTensor(backend, s)
		if err != nil {
			return nil, nil, err
		}
		copy(dst, r.data[b.offsets[i]:b.offsets[i]+int(s.Memory())])
		out[i] = t
	}
	return out[:b.inputs], out[b.inputs:], nil
}

// decodeRound reads a message of encodeRound (or an error's), checking every length against the message.
func decodeRound(msg []byte) (r dispatchedRound, err error) {
	defer recovered("prepare: decoding a dispatch message", &err) // an unknown dtype's size panics
	if len(msg) == 0 {
		return dispatchedRound{}, errors.New("prepare: empty dispatch message")
	}
	if msg[0] == msgError {
		return dispatchedRound{}, fmt.Errorf("prepare: rank 0 could not dispatch the batches: %s", msg[1:])
	}
	bad := errors.New("prepare: malformed dispatch message")
	pos := 1
	uvarint := func() (int, bool) {
		v, n := binary.Uvarint(msg[pos:])
		if n <= 0 || v > 1<<40 {
			return 0, false
		}
		pos += n
		return int(v), true
	}
	count, ok1 := uvarint()
	next, ok2 := uvarint()
	if msg[0] != msgRound || !ok1 || !ok2 || count > len(msg) {
		return dispatchedRound{}, bad
	}
	r = dispatchedRound{batches: make([]dispatchedBatch, count), next: next}
	for j := range r.batches {
		nIn, ok1 := uvarint()
		nLab, ok2 := uvarint()
		if !ok1 || !ok2 || nIn+nLab > len(msg) {
			return dispatchedRound{}, bad
		}
		b := dispatchedBatch{inputs: nIn}
		for range nIn + nLab {
			dtype, ok1 := uvarint()
			rank, ok2 := uvarint()
			if !ok1 || !ok2 || rank > len(msg) {
				return dispatchedRound{}, bad
			}
			dims := make([]int, rank)
			for d := range dims {
				var ok bool
				if dims[d], ok = uvarint(); !ok {
					return dispatchedRound{}, bad
				}
			}
			b.shapes = append(b.shapes, shapes.Make(dtypes.DType(dtype), dims...))
		}
		r.batches[j] = b
	}
	r.data = msg[pos:]
	offset := 0
	for j := range r.batches {
		b := &r.batches[j]
		for _, s := range b.shapes {
			b.offsets = append(b.offsets, offset)
			offset += int(s.Memory())
			if offset > len(r.data) {
				return dispatchedRound{}, fmt.Errorf("%w: its shapes need more than its %d bytes of data", bad, len(r.data))
			}
		}
	}
	if offset != len(r.data) {
		return dispatchedRound{}, fmt.Errorf("%w: its shapes need %d bytes of data, it holds %d", bad, offset,
			len(r.data))
	}
	return r, nil
}
