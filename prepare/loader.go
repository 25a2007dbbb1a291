package prepare

import (
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"slices"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/train"
)

// Batch is one rank's batch.
type Batch struct {
	Inputs, Labels []*tensors.Tensor
	// Indices are the source indices of this rank's examples (for streaming sources, nil).
	Indices []int
	// Epoch and Step locate the batch: Step counts this rank's batches within the epoch from 0. In an epoch
	// resumed from a checkpoint it is the batch's place in this run's batches: the examples of the epoch's
	// order before it over N·b, rounded down (exact when the checkpoint fell on a batch of this run, as it
	// does with the saved global batch).
	Epoch, Step int
	// Valid is the number of leading examples of this batch that are real; the rest repeat examples from
	// the start of the epoch so that every rank yields as many batches as the others (even batches).
	Valid int
	// ValidPerRank is Valid for every rank's batch of this step (the same on all ranks), which is what
	// GatherForMetrics needs to drop the padding after gathering.
	ValidPerRank []int
}

// Size is the number of examples in the batch, padding included.
func (b Batch) Size() int {
	if len(b.Inputs) == 0 || b.Inputs[0].Shape().Rank() == 0 {
		return 0
	}
	return b.Inputs[0].Shape().Dimensions[0]
}

// LoaderOption configures a DataLoader.
type LoaderOption func(*loaderConfig)

type loaderConfig struct {
	batchSize   int
	shuffle     bool
	dropLast    bool
	evenBatches bool
	seed        uint64
	prefetch    bool
	split       bool
	// dispatch: only rank 0 reads the stream and sends every rank its batch (dispatch.go).
	dispatch bool
	// noCheckpoint leaves the loader out of the Accelerator's checkpoints.
	noCheckpoint bool
}

// BatchSize sets the per-rank batch size: N ranks each take this many examples per step.
func BatchSize(n int) LoaderOption { return func(c *loaderConfig) { c.batchSize = n } }

// SplitBatches makes BatchSize the global batch size, split evenly across the ranks (Accelerate's
// split_batches): with N ranks each takes BatchSize/N examples per step, so the examples per step stay
// the same whatever the number of processes. The batch size must divide by N. Indexable sources only.
func SplitBatches() LoaderOption { return func(c *loaderConfig) { c.split = true } }

// SkipCheckpoint leaves the loader out of checkpoints: SaveState does not record its position and
// LoadState neither expects nor restores one. Use it for loaders that only some runs prepare, or prepare at
// another point of the program — an evaluation loader made inside an evaluate function — whose position
// does not matter for resuming training.
func SkipCheckpoint() LoaderOption { return func(c *loaderConfig) { c.noCheckpoint = true } }

// EvenBatches reports whether every process yields as many batches per epoch (EvenBatches, the default).
func (l *DataLoader) EvenBatches() bool { return l.cfg.evenBatches }

// Checkpointed reports whether checkpoints record the loader's position (see SkipCheckpoint).
func (l *DataLoader) Checkpointed() bool { return !l.cfg.noCheckpoint }

// Shuffle permutes the examples every epoch, identically on every rank (seed + epoch).
func Shuffle() LoaderOption { return func(c *loaderConfig) { c.shuffle = true } }

// DropLast drops the final examples that do not fill a whole batch on every rank.
func DropLast() LoaderOption { return func(c *loaderConfig) { c.dropLast = true } }

// EvenBatches (on by default) pads the last round by wrapping around to the start of the epoch so that
// every rank yields the same number of batches of the same size: a rank with one batch fewer would wait
// forever in the others' gradient sync. Turn it off only for per-rank work with no collectives.
func EvenBatches(on bool) LoaderOption { return func(c *loaderConfig) { c.evenBatches = on } }

// Prefetch (on by default) gathers the next batch of an indexable source on another goroutine while the
// current one trains, so copying examples overlaps compute. The source's Batch is still called for one
// batch at a time, in order; turn prefetching off for a source that must be read from the loop's
// goroutine.
func Prefetch(on bool) LoaderOption { return func(c *loaderConfig) { c.prefetch = on } }

// Seed sets the shuffling seed (by default the Accelerator's seed).
func Seed(seed uint64) LoaderOption {
	return func(c *loaderConfig) { c.seed = seed }
}

// DataLoader yields this rank's batches of each epoch.
type DataLoader struct {
	rt     *Runtime
	source Source
	stream train.Dataset
	cfg    loaderConfig

	epoch         int
	epochExplicit bool  // SetEpoch (or Restore) was called since the last iteration began
	epochErr      error // a SetEpoch the next iteration refuses (a negative epoch)
	iterated      bool
	// start is where the next iteration of the epoch begins in the epoch's global order: the number of
	// examples (for a stream, batches) the job consumed before a checkpoint. Restore sets it; 0 otherwise.
	start int
	// iterEpoch and iterStart are the epoch and start of the current (or last) iteration, yielded the
	// number of batches it yielded, and finished whether it yielded the epoch's last batch.
	iterEpoch, iterStart, yielded int
	finished                      bool
	iterating                     bool
}

// NewDataLoader shards an indexable source across the runtime's ranks.
func NewDataLoader(rt *Runtime, source Source, opts ...LoaderOption) (*DataLoader, error) {
	if source == nil {
		return nil, errors.New("prepare: data loader source is nil")
	}
	l, err := newLoader(rt, opts)
	if err != nil {
		return nil, err
	}
	if l.cfg.dispatch {
		return nil, errors.New("prepare: Dispatch is for streams (NewStreamLoader): an indexable source is " +
			"sharded by index, every rank reading its own examples with no messages")
	}
	l.source = source
	n := source.Len()
	if n <= 0 {
		return nil, errors.New("prepare: the dataset is empty (zero examples)")
	}
	// Only drop-last can leave a rank without a batch while others have one (with uneven shards a rank with
	// no example is what the user asked for; even batches always give every rank at least one).
	if l.cfg.dropLast && l.Len() == 0 {
		return nil, fmt.Errorf("prepare: batch size %d is larger than the %d examples each of the %d rank(s) gets "+
			"with drop-last: an epoch would have no batch", l.cfg.batchSize, n/rt.Comm.Size(), rt.Comm.Size())
	}
	return l, nil
}

// NewStreamLoader shards a GoMLX train.Dataset by batches: rank r keeps batches r, r+N, r+2N… of each
// pass. Every rank reads the whole stream (a stream cannot be indexed), so this suits datasets that are
// cheap to read; prefer an indexable Source when there is one. With Dispatch, rank 0 alone reads it and
// sends every rank its batch; ranks other than 0 may then pass a nil dataset.
func NewStreamLoader(rt *Runtime, ds train.Dataset, opts ...LoaderOption) (*DataLoader, error) {
	l, err := newLoader(rt, opts)
	if err != nil {
		return nil, err
	}
	if ds == nil {
		if !l.cfg.dispatch || rt.Comm.Rank() == 0 {
			return nil, errors.New("prepare: data loader dataset is nil")
		}
		// The loader tells a stream from a source by this field: a rank that only receives still has a
		// stream, read elsewhere.
		ds = dispatchedElsewhere{}
	}
	if l.cfg.split {
		return nil, errors.New("prepare: split batches needs an indexable source: a stream's batches come whole")
	}
	l.stream = ds
	return l, nil
}

func newLoader(rt *Runtime, opts []LoaderOption) (*DataLoader, error) {
	if err := rt.validate(); err != nil {
		return nil, err
	}
	cfg := loaderConfig{evenBatches: true, batchSize: 1, prefetch: true}
	for _, opt := range opts {
		opt(&cfg)
	}
	if cfg.batchSize < 1 {
		return nil, fmt.Errorf("prepare: batch size must be at least 1, got %d", cfg.batchSize)
	}
	if size := rt.Comm.Size(); cfg.split {
		if cfg.batchSize%size != 0 {
			return nil, fmt.Errorf("prepare: split batches: the global batch size %d does not divide by the %d "+
				"processes; choose a multiple of %d", cfg.batchSize, size, size)
		}
		cfg.batchSize /= size
	}
	return &DataLoader{rt: rt, cfg: cfg}, nil
}

// SetEpoch selects the epoch whose order the next iteration yields. Without it, each new iteration
// advances the epoch by one, so forgetting it does not repeat the same order. Setting the epoch a Restore
// selected keeps the restored position; any other epoch starts at its first batch.
func (l *DataLoader) SetEpoch(epoch int) {
	l.epochErr = nil
	if epoch < 0 {
		// SetEpoch returns nothing (as DistributedSampler.set_epoch): the next iteration reports it.
		l.epochErr = fmt.Errorf("prepare: SetEpoch(%d): epochs count from 0", epoch)
		return
	}
	if epoch != l.epoch {
		l.start = 0
	}
	l.epoch, l.epochExplicit = epoch, true
}

// Epoch is the epoch of the current (or next) iteration.
func (l *DataLoader) Epoch() int { return l.epoch }

// BatchSize is the per-rank batch size (with SplitBatches, the global one divided by the world size).
func (l *DataLoader) BatchSize() int { return l.cfg.batchSize }

// pending reports whether the loader's place is the next iteration's (a SetEpoch or Restore since the last
// iteration began, or no iteration yet) rather than the current or last iteration's.
func (l *DataLoader) pending() bool { return !l.iterated || (l.epochExplicit && !l.iterating) }

// Position is the number of batches of the current epoch already yielded, counted in this run's batches
// (see Batch.Step): between a SetEpoch or Restore and the loop, the batches the next iteration skips.
func (l *DataLoader) Position() int {
	if l.pending() {
		return l.firstStep(l.start)
	}
	return l.firstStep(l.iterStart) + l.yielded
}

// firstStep is the Step of the batch that starts at position start of the epoch's global order: the whole
// batches of this run (N ranks × batch size, or N stream batches) before it.
func (l *DataLoader) firstStep(start int) int {
	if l.stream != nil {
		return start / l.rt.Comm.Size()
	}
	return start / (l.rt.Comm.Size() * l.cfg.batchSize)
}

// consumed is the number of examples (for a stream, batches) of the epoch's global order that the job's
// ranks consumed together in the current or last iteration, its start included: with strided sharding the
// first m batches of N ranks are exactly the first N·m·b positions of the order, whatever N.
func (l *DataLoader) consumed() int {
	if l.stream != nil {
		return l.iterStart + l.yielded*l.rt.Comm.Size()
	}
	return min(l.iterStart+l.yielded*l.rt.Comm.Size()*l.cfg.batchSize, l.source.Len())
}

// restore makes the next iteration yield epoch's order from position start on: a resumed job skips the
// examples it consumed before its checkpoint without computing them. An epoch whose rest fills no batch on
// this run's ranks (all consumed, or less than drop-last keeps) resumes at the next epoch's start instead,
// so that a resumed loop never runs an empty epoch.
func (l *DataLoader) restore(epoch, start int) {
	if l.source != nil && l.segmentBatchesAll(start) == 0 {
		epoch, start = epoch+1, 0
	}
	l.epoch, l.epochExplicit, l.start = epoch, true, start
}

// SourceLen is the number of examples in the whole source, before sharding (for a stream, unknown: -1).
// Ranks whose sources differ in length would shard different datasets, even when they yield the same
// number of batches.
func (l *DataLoader) SourceLen() int {
	if l.stream != nil {
		return -1
	}
	return l.source.Len()
}

// Len is the number of batches this rank yields per epoch (for a stream, unknown: -1).
func (l *DataLoader) Len() int {
	if l.stream != nil {
		return -1
	}
	return l.segmentBatches(0, l.rt.Comm.Rank())
}

// segmentBatches is the number of batches rank yields in an iteration that starts at position start of
// the epoch's order.
func (l *DataLoader) segmentBatches(start, rank int) int {
	shardLen := l.shardLenOf(l.source.Len()-start, rank)
	if l.cfg.dropLast {
		return shardLen / l.cfg.batchSize
	}
	return (shardLen + l.cfg.batchSize - 1) / l.cfg.batchSize
}

// segmentBatchesAll is the number of batches the rank with the most yields from start on: zero only when
// no rank has a batch left.
func (l *DataLoader) segmentBatchesAll(start int) int {
	return l.segmentBatches(start, 0) // rank 0's shard is never shorter than another's
}

// remainder is the number of real examples in the iteration's last round of batches across all ranks, when
// it is not complete ((n − start) mod N·b, as Accelerate's GradientState.remainder); 0 when every round is
// full or drop-last cuts the tail; -1 for a stream, whose length is unknown.
func (l *DataLoader) remainder(start int) int {
	if l.stream != nil {
		return -1
	}
	if l.cfg.dropLast {
		return 0
	}
	return (l.source.Len() - start) % (l.cfg.batchSize * l.rt.Comm.Size())
}

// shardLenOf is the number of examples (padding included) rank gets out of rest real examples: the same
// for every rank unless even batches are off.
func (l *DataLoader) shardLenOf(rest, rank int) int {
	size := l.rt.Comm.Size()
	if l.cfg.dropLast {
		return rest / size
	}
	if l.cfg.evenBatches {
		return (rest + size - 1) / size
	}
	return rest/size + boolToInt(rank < rest%size)
}

// order is an iteration's global order of example indices: the epoch's permutation, computed identically
// on every rank from seed and epoch, from position start on; then, for even batches, wrapped around to the
// start of the epoch up to a multiple of the world size, or, for drop-last, cut to one. Rank r's j-th
// example is order[j·N + r]. A resumed epoch thus ends the way a fresh epoch of its rest would on this
// run's ranks, whatever the number of ranks that consumed its start.
func (l *DataLoader) order(epoch, start int) []int {
	n, size := l.source.Len(), l.rt.Comm.Size()
	var perm []int
	if l.cfg.shuffle {
		perm = rand.New(rand.NewPCG(l.cfg.seed, uint64(epoch))).Perm(n)
	} else {
		perm = make([]int, n)
		for i := range perm {
			perm[i] = i
		}
	}
	rest := perm[start:]
	switch r := len(rest); {
	case l.cfg.dropLast:
		rest = rest[:r-r%size]
	case l.cfg.evenBatches && r%size != 0:
		rest = slices.Clone(rest)
		for i := 0; len(rest)%size != 0; i++ {
			rest = append(rest, perm[i%n])
		}
	}
	return rest
}

// All yields this rank's batches of one epoch. While the last batch is being processed the gradient
// state knows it, so Accumulate syncs there even when the number of batches is not a multiple of K.
func (l *DataLoader) All() iter.Seq2[Batch, error] {
	return func(yield func(Batch, error) bool) {
		if l.iterating {
			yield(Batch{}, errors.New("prepare: data loader iterated while already iterating"))
			return
		}
		if l.epochErr != nil {
			yield(Batch{}, l.epochErr)
			return
		}
		l.beginEpoch()
		l.iterating = true
		// The loader is the innermost active one until its loop ends: a loop over another loader inside
		// this one's (an evaluation during training) keeps its own end-of-dataloader flag.
		exit := l.rt.State.EnterLoader(l, l.remainder(l.iterStart))
		defer func() {
			l.iterating = false
			l.rt.State.SetEndOfDataloader(false)
			exit()
		}()
		switch {
		case l.stream != nil && l.cfg.dispatch:
			l.iterateDispatched(yield)
			return
		case l.stream != nil:
			l.iterateStream(yield)
			return
		}
		l.iterateSource(yield)
	}
}

func (l *DataLoader) beginEpoch() {
	if l.iterated && !l.epochExplicit {
		l.epoch++
		l.start = 0
	}
	l.iterated, l.epochExplicit = true, false
	// The start is used once: the epoch's next iteration, unless restored again, is a whole one.
	l.iterEpoch, l.iterStart, l.yielded, l.finished = l.epoch, l.start, 0, false
	l.start = 0
}

// yielded1 records that the iteration is about to yield a batch, the epoch's last one when last.
func (l *DataLoader) yielded1(last bool) {
	l.yielded++
	l.finished = last
	l.rt.State.SetEndOfDataloader(last)
}

func (l *DataLoader) iterateSource(yield func(Batch, error) bool) {
	// The epoch is read once: a SetEpoch inside the loop is for the next iteration.
	epoch, start := l.iterEpoch, l.iterStart
	order := l.order(epoch, start)
	numBatches := l.segmentBatches(start, l.rt.Comm.Rank())
	// next, when not nil, delivers batch step+1, gathered while step trains. It only reads the source and
	// the loader's configuration, which do not change during an iteration; a consumer that stops early
	// leaves it to finish into its buffered channel and be collected.
	type gathered struct {
		batch Batch
		err   error
	}
	var next chan gathered
	for step := 0; step < numBatches; step++ {
		var batch Batch
		var err error
		if next != nil {
			g := <-next
			batch, err = g.batch, g.err
		} else {
			batch, err = l.sourceBatch(order, epoch, start, step)
		}
		next = nil
		if l.cfg.prefetch && err == nil && step+1 < numBatches {
			ch := make(chan gathered, 1)
			go func(step int) {
				b, err := l.sourceBatch(order, epoch, start, step)
				ch <- gathered{b, err}
			}(step + 1)
			next = ch
		}
		l.yielded1(step == numBatches-1)
		if !yield(batch, err) || err != nil {
			return
		}
	}
}

// sourceBatch gathers this rank's batch step of an iteration whose global order (from position start of
// the epoch on) is order. Rank r's j-th example of the iteration is order[j·N + r]; positions from the
// rest's length on are the even-batches padding.
func (l *DataLoader) sourceBatch(order []int, epoch, start, step int) (Batch, error) {
	rest, size, rank := l.source.Len()-start, l.rt.Comm.Size(), l.rt.Comm.Rank()
	lo := step * l.cfg.batchSize
	batch := Batch{Epoch: epoch, Step: l.firstStep(start) + step, ValidPerRank: make([]int, size)}
	for r := range size {
		// Each rank's own shard length: without even batches the ranks' last batches differ.
		for j := lo; j < min(lo+l.cfg.batchSize, l.shardLenOf(rest, r)); j++ {
			if j*size+r < rest {
				batch.ValidPerRank[r]++
			}
		}
	}
	batch.Valid = batch.ValidPerRank[rank]
	for j := lo; j < min(lo+l.cfg.batchSize, l.shardLenOf(rest, rank)); j++ {
		batch.Indices = append(batch.Indices, order[j*size+rank])
	}
	var err error
	if s, ok := l.source.(backendSource); ok {
		batch.Inputs, batch.Labels, err = s.batchOn(l.rt.Backend, batch.Indices)
	} else {
		batch.Inputs, batch.Labels, err = l.source.Batch(batch.Indices)
	}
	if err != nil {
		err = fmt.Errorf("prepare: loading batch %d of epoch %d: %w", batch.Step, epoch, err)
	}
	return batch, err
}

func boolToInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// PeekBatch returns this rank's first batch of the next iteration without consuming it: handy to build a
// model (Model.Materialize) before the loop. When this rank's share of the next iteration is empty, it
// returns the epoch's first batch so that the model can still be built.
func (l *DataLoader) PeekBatch() (Batch, error) {
	if l.stream != nil {
		return Batch{}, errors.New("prepare: PeekBatch needs an indexable source")
	}
	if l.Len() == 0 {
		return Batch{}, fmt.Errorf("prepare: rank %d has no batch to peek at: its shard is empty", l.rt.Comm.Rank())
	}
	// The same choice of epoch and start as beginEpoch makes.
	epoch, start := l.epoch, l.start
	if l.iterated && !l.epochExplicit {
		epoch, start = epoch+1, 0
	}
	if l.segmentBatches(start, l.rt.Comm.Rank()) == 0 {
		start = 0
	}
	return l.sourceBatch(l.order(epoch, start), epoch, start, 0)
}
