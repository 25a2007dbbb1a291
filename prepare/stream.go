package prepare

import (
	"errors"
	"fmt"
	"io"

	"github.com/gomlx/gomlx/pkg/core/tensors"
)

type streamBatch struct {
	inputs, labels []*tensors.Tensor
}

// iterateStream reads the dataset in rounds of N batches and keeps this rank's. It looks one round ahead
// so that it knows which batch is the last one (the gradient state must know before that batch's backward).
// An incomplete final round is dropped with DropLast; otherwise, with even batches, ranks without a batch of
// their own in it reuse one of the round's batches, marked as padding (Valid = 0). Without even batches
// such ranks simply yield one batch fewer.
func (l *DataLoader) iterateStream(yield func(Batch, error) bool) {
	size, rank := l.rt.Comm.Size(), l.rt.Comm.Rank()
	epoch := l.iterEpoch // a SetEpoch inside the loop is for the next iteration
	l.stream.Reset()
	// eof: the dataset said io.EOF. It is not asked again: train.Dataset only promises Reset after io.EOF.
	eof, read := false, 0
	readRound := func() ([]streamBatch, error) {
		var round []streamBatch
		for len(round) < size && !eof {
			begin := l.rt.beginLoad()
			_, inputs, labels, err := l.stream.Yield()
			if errors.Is(err, io.EOF) {
				eof = true
				break
			}
			l.rt.observeLoad(begin, inputs)
			if err != nil {
				return nil, fmt.Errorf("prepare: reading dataset %q: %w", l.stream.Name(), err)
			}
			read++
			round = append(round, streamBatch{inputs, labels})
		}
		if len(round) < size && (l.cfg.dropLast || (!l.cfg.evenBatches && rank >= len(round))) {
			return nil, nil
		}
		return round, nil
	}
	// A resumed epoch starts after the batches the job consumed before its checkpoint (start counts
	// stream batches over every rank): they are read and dropped without being computed.
	start := l.iterStart
	for read < start && !eof {
		if _, _, _, err := l.stream.Yield(); errors.Is(err, io.EOF) {
			eof = true
		} else if err != nil {
			yield(Batch{}, fmt.Errorf("prepare: reading dataset %q: %w", l.stream.Name(), err))
			return
		} else {
			read++
		}
	}
	current, err := readRound()
	if err != nil {
		yield(Batch{}, err)
		return
	}
	if len(current) == 0 && start == 0 && (read == 0 || l.cfg.dropLast) {
		yield(Batch{}, fmt.Errorf("prepare: dataset %q yielded %d batch(es), too few for one round of %d rank(s)",
			l.stream.Name(), read, size))
		return
	}
	for step := l.firstStep(start); len(current) > 0; step++ {
		next, err := readRound()
		if err != nil {
			yield(Batch{}, err)
			return
		}
		batch := Batch{Epoch: epoch, Step: step, ValidPerRank: make([]int, size)}
		for r := range size {
			if r < len(current) {
				batch.ValidPerRank[r] = Batch{Inputs: current[r].inputs}.Size()
			}
		}
		mine := current[rank%len(current)]
		batch.Inputs, batch.Labels, batch.Valid = mine.inputs, mine.labels, batch.ValidPerRank[rank]
		l.yielded1(len(next) == 0)
		if !yield(batch, nil) {
			return
		}
		current = next
	}
}
