package accumulate

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"unsafe"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/floats"
	"github.com/goaccel/goaccel/internal/vec32"
)

// Reducer owns the synchronisation of one model's gradients: the bucket accumulators, the decision (from
// the GradientState) of which micro-batches sync, what happened since the last optimizer step (synced,
// dirty, the averaging scale, a non-finite loss), and the communication itself, which goes through a
// CommHook and a Sharding strategy. The prepared model runs executables and tells the reducer about each
// micro-batch; the optimizer asks the reducer whether there is something to apply and with which scale;
// checkpoints read and restore it through State and Restore.
//
// A reducer made without WithGradientState and WithAccumulators only syncs the buckets it is given (Sync):
// what benchmarks of the communication alone, and programs that sync tensors of their own, use.
//
// The micro-batch protocol — BeginMicroBatch, EndMicroBatch, ReadyToApply, Applied, ZeroGrad, Clear,
// Finite, NonFiniteRanks, and State, Restore, GatherState, SavedState — is driven by package prepare and by
// the Accelerator's checkpoints; a training loop never calls it. It stays exported because a CommHook or a
// Sharding (the plug points) is written against the reducer that calls it.
type Reducer struct {
	comm     *backends.Communicator
	plan     Plan
	hook     CommHook
	sharding Sharding

	state        *GradientState
	accumulators []*context.Variable
	// shards receive this rank's block of each synced bucket under a strategy that splits buckets (nil
	// under Replicated, whose accumulators hold the synced sums in place).
	shards []*context.Variable
	// emitted are the gradients of a micro-batch that syncs straight from the backward pass, without an
	// accumulator (ShardGradients): what that sync sends, set by EmitGradients.
	emitted []*tensors.Tensor
	// makeAccumulators makes the accumulators when a restore needs them before any micro-batch did.
	makeAccumulators func() ([]*context.Variable, error)

	syncs int64
	// synced is set when the accumulators hold all-reduced gradients not yet applied; scale is the factor
	// (1/world size, times the short-cycle correction) that turns them into the mean.
	synced bool
	scale  float64
	// dirty is set when the accumulators may hold non-zero values.
	dirty bool
	// spent is set when the accumulators still hold sums an optimizer step applied (AppliedLeavingSums):
	// they read as zeros, and are cleared before anything else reads them (ClearSpent).
	spent bool
	// nonFinite is set when a micro-batch since the last sync had a NaN or Inf loss on this rank;
	// poisoned, when this rank's last sync carried such a loss (until the gradients are applied or cleared).
	nonFinite, poisoned bool
	// local makes the syncs an optimizer step follows keep this rank's own gradients (local SGD).
	local bool
	// overlap holds the buckets a syncing step started while it ran (overlap.go).
	overlap overlap
}

// ReducerOption configures a Reducer.
type ReducerOption func(*Reducer)

// WithCommHook sets the hook that carries buckets between ranks (default IdentityHook).
func WithCommHook(h CommHook) ReducerOption { return func(r *Reducer) { r.hook = h } }

// WithSharding sets the sharding strategy (default Replicated).
func WithSharding(s Sharding) ReducerOption { return func(r *Reducer) { r.sharding = s } }

// WithGradientState makes the reducer follow state's decisions of when to sync.
func WithGradientState(state *GradientState) ReducerOption {
	return func(r *Reducer) { r.state = state }
}

// WithAccumulators gives the reducer the model's bucket accumulators, one flat variable per plan bucket,
// each laid out Sharding.Padded long. Under ShardGradients they may be given later (SetAccumulators), when
// a micro-batch first accumulates without syncing.
func WithAccumulators(vars []*context.Variable) ReducerOption {
	return func(r *Reducer) { r.accumulators = vars }
}

// WithLocalGradients makes the micro-batches an optimizer step follows end their cycle without any
// communication: the accumulators keep this rank's own gradients, and Scale turns them into this rank's
// mean over the cycle's micro-batches (1, or the short-cycle correction), not a mean over ranks. Local SGD
// and DiLoCo train so, and average the parameters instead every few steps (package prepare).
func WithLocalGradients() ReducerOption { return func(r *Reducer) { r.local = true } }

// Local reports whether the reducer keeps each rank's gradients to itself (WithLocalGradients).
func (r *Reducer) Local() bool { return r.local }

// WithShards gives the reducer, under a strategy that splits buckets, the variables that receive this
// rank's block of each synced bucket (BlockLen elements each), which the optimizer's update reads.
func WithShards(vars []*context.Variable) ReducerOption {
	return func(r *Reducer) { r.shards = vars }
}

// NewReducer returns a reducer for plan over comm.
func NewReducer(comm *backends.Communicator, plan Plan, opts ...ReducerOption) *Reducer {
	r := &Reducer{comm: comm, plan: plan, hook: IdentityHook{}, sharding: Replicated{}}
	for _, opt := range opts {
		opt(r)
	}
	return r
}

// Plan is the bucket plan this reducer serves.
func (r *Reducer) Plan() Plan { return r.plan }

// Syncs is the number of syncs performed.
func (r *Reducer) Syncs() int64 { return r.syncs }

// CommHook is the hook that carries buckets between ranks.
func (r *Reducer) CommHook() CommHook { return r.hook }

// Sharding is the sharding strategy.
func (r *Reducer) Sharding() Sharding { return r.sharding }

// Accumulators are the bucket accumulators (nil without WithAccumulators, and under ShardGradients until a
// micro-batch accumulated). They are per-rank: a checkpoint taken mid-cycle must keep every rank's. After
// an optimizer step that left its sums in them (AppliedLeavingSums) their values are those sums until the
// next micro-batch sets them: read them after ClearSpent, as every reader in this package does.
func (r *Reducer) Accumulators() []*context.Variable { return r.accumulators }

// SetAccumulators gives the reducer the accumulators it was made without (ShardGradients makes them when a
// micro-batch first accumulates without syncing).
func (r *Reducer) SetAccumulators(vars []*context.Variable) error {
	if len(vars) != len(r.plan.Buckets) {
		return fmt.Errorf("accumulate: %d accumulators for a plan of %d buckets", len(vars), len(r.plan.Buckets))
	}
	r.accumulators, r.spent = vars, false
	return nil
}

// WithAccumulatorMaker gives a reducer made without accumulators (ShardGradients) the function that makes
// them, for a checkpoint restored in the middle of an accumulation cycle.
func WithAccumulatorMaker(make func() ([]*context.Variable, error)) ReducerOption {
	return func(r *Reducer) { r.makeAccumulators = make }
}

// Shards are the variables that receive this rank's block of each synced bucket (nil under Replicated).
func (r *Reducer) Shards() []*context.Variable { return r.shards }

// Sharded reports whether the strategy splits buckets between ranks: the synced gradients are then in
// Shards, not in the accumulators.
func (r *Reducer) Sharded() bool { return r.sharding.Stage() > 0 }

// EmitGradients hands the reducer the gradients of the micro-batch about to end (EndMicroBatch), one flat
// tensor per bucket laid out Sharding.Padded long, when that micro-batch syncs and nothing was accumulated
// since the last step: the sync sends them instead of the accumulators (ShardGradients).
func (r *Reducer) EmitGradients(grads []*tensors.Tensor) error {
	if len(grads) != len(r.plan.Buckets) {
		return fmt.Errorf("accumulate: %d gradient tensors for a plan of %d buckets", len(grads), len(r.plan.Buckets))
	}
	if r.dirty {
		return errors.New("accumulate: gradients emitted after micro-batches accumulated: add them to the accumulators")
	}
	r.emitted = grads
	return nil
}

// ZeroAccumulators zeroes the accumulators in place (where the engines sum them), for an update that did not
// zero them in its graph (a strategy that splits buckets) and for ClearSpent.
func (r *Reducer) ZeroAccumulators() error {
	for _, v := range r.accumulators {
		t, err := v.Value()
		if err != nil {
			return err
		}
		buf, err := hostBuffer(t)
		if err != nil {
			return fmt.Errorf("accumulate: clearing accumulator %q: %w", v.ScopeAndName(), err)
		}
		clear(unsafe.Slice((*byte)(buf.Ptr), buf.Bytes))
	}
	// Only once every bucket is clear: a failure half-way leaves the rest spent, still read as zeros.
	r.spent = false
	return nil
}

// SetScale replaces the factor that turns the synced sums into the gradient the optimizer applies (see
// Scale), while they are synced and not yet applied: a mean over something else than processes, such as
// the examples of every process's micro-batches (the Accelerator's Join).
func (r *Reducer) SetScale(scale float64) error {
	if !r.synced {
		return errors.New("accumulate: the scale of synced gradients set when none are synced")
	}
	if !(scale >= 0) || math.IsInf(scale, 0) {
		return fmt.Errorf("accumulate: the scale of synced gradients must be a finite number ≥ 0, got %g", scale)
	}
	r.scale = scale
	return nil
}

// Dirty reports whether the accumulators may hold gradients of micro-batches since the last step.
func (r *Reducer) Dirty() bool { return r.dirty }

// ClearSpent zeroes accumulators that still hold the sums the last optimizer step applied
// (AppliedLeavingSums), and does nothing otherwise. A graph that adds into the accumulators, or any reader of
// their values, calls it first; a micro-step that sets them (the first after a step, see Dirty) need not.
func (r *Reducer) ClearSpent() error {
	if !r.spent {
		return nil
	}
	return r.ZeroAccumulators()
}

// Synced reports whether the accumulators hold synchronised gradients that were not applied yet.
func (r *Reducer) Synced() bool { return r.synced }

// Scale is the factor that turns the synchronised sums into the mean gradient (valid while Synced).
func (r *Reducer) Scale() float64 { return r.scale }

// ReadyToApply reports whether the optimizer step that follows applies gradients: the current Backward
// synced, and the synced gradients were not applied or cleared yet.
func (r *Reducer) ReadyToApply() bool { return r.state != nil && r.state.SyncGradients() && r.synced }

var errNotForModel = errors.New("accumulate: the reducer was made without a gradient state and accumulators")

func (r *Reducer) forModel() error {
	if r.state == nil || (len(r.accumulators) != len(r.plan.Buckets) && r.sharding.Stage() < 2) {
		return errNotForModel
	}
	if r.Sharded() && len(r.shards) != len(r.plan.Buckets) {
		return fmt.Errorf("accumulate: the %s strategy needs a shard per bucket, got %d for %d buckets",
			r.sharding.Name(), len(r.shards), len(r.plan.Buckets))
	}
	return nil
}

// BeginMicroBatch is called before a micro-batch's gradients are added to the accumulators. It reports
// whether this micro-batch syncs (and so whether the optimizer step after it applies).
func (r *Reducer) BeginMicroBatch() (syncs bool, err error) {
	if err := r.forModel(); err != nil {
		return false, err
	}
	if r.synced {
		return false, errors.New("accumulate: Backward after a sync whose gradients were not applied: call the " +
			"optimizer's Step (or ZeroGrad) first")
	}
	return r.state.SyncGradients(), nil
}

// EndMicroBatch is called once a micro-batch's gradients, multiplied by scale, were added to the
// accumulators, with the micro-batch's loss on this rank. It synchronises when the gradient state says
// so: a sync when this micro-batch steps, an all-reduce that does not step with sync-each-batch.
func (r *Reducer) EndMicroBatch(scale, loss float64) error {
	if err := r.forModel(); err != nil {
		return err
	}
	// Emitted gradients went nowhere but to this sync: the accumulators stay clean. Otherwise the micro-step
	// wrote them (set after a step, or added into them once ClearSpent had run).
	r.dirty = r.dirty || r.emitted == nil
	r.spent = r.spent && r.emitted != nil
	r.state.recordMicroBatch(scale)
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		r.nonFinite = true
	}
	switch {
	case r.state.SyncGradients():
		return r.sync()
	case r.state.reduceThisStep() && !r.local:
		return r.reduceMicroBatch()
	}
	return nil
}

// Applied records that the optimizer applied the synced gradients and zeroed the accumulators (in its update
// graph, or on the host: ZeroAccumulators).
func (r *Reducer) Applied() { r.synced, r.dirty, r.poisoned = false, false, false }

// AppliedLeavingSums records that the optimizer applied the synced gradients and left the accumulators
// holding them: the next micro-batch sets them instead of adding into them (Dirty is false), so an update
// need not write zeros that the next micro-batch overwrites. Until then they read as zeros: ClearSpent, which
// every reader of their values here runs, clears them first.
func (r *Reducer) AppliedLeavingSums() {
	r.Applied()
	r.spent = r.accumulators != nil
}

// ZeroGrad clears the accumulators, except on micro-batches that do not sync, where it does nothing (as the
// optimizer's Step), so that the same loop body works with and without accumulation.
func (r *Reducer) ZeroGrad() error {
	if r.state == nil || !r.state.SyncGradients() {
		return nil
	}
	return r.Clear()
}

// Clear zeroes the accumulators on the host (cheaper than a compiled step, and off the hot path: after an
// optimizer step the next micro-batch sets them) and forgets what happened since the last step.
func (r *Reducer) Clear() error {
	if err := r.forModel(); err != nil {
		return err
	}
	r.emitted = nil
	// Spent sums already read as zeros: an optimizer step followed by ZeroGrad clears nothing.
	if r.dirty || r.synced {
		for _, v := range r.accumulators {
			if err := v.SetValue(tensors.FromShape(v.Shape())); err != nil {
				return fmt.Errorf("accumulate: clearing accumulator %q: %w", v.ScopeAndName(), err)
			}
		}
	}
	r.dirty, r.synced, r.nonFinite, r.poisoned = false, false, false, false
	r.state.ResetMicroBatches()
	return nil
}

// NonFiniteRanks names the ranks whose loss was NaN or Inf in a micro-batch of the last sync, for the
// error of a refused step: synced gradients show that some rank was not finite, not which. Collective:
// every rank calls it, at the same point (after Finite reported false, which every rank sees alike), and
// gets the same list (empty when every loss was finite and the gradients themselves overflowed).
func (r *Reducer) NonFiniteRanks() ([]int, error) {
	mine := []int64{0}
	if r.poisoned {
		mine[0] = 1
	}
	all := make([]int64, r.comm.Size())
	if r.comm.Size() == 1 {
		all[0] = mine[0]
	} else if err := r.comm.AllGather(backends.BufferOf(mine), backends.BufferOf(all)); err != nil {
		return nil, fmt.Errorf("accumulate: finding the ranks with a non-finite loss: %w", err)
	}
	var ranks []int
	for rank, flag := range all {
		if flag != 0 {
			ranks = append(ranks, rank)
		}
	}
	return ranks, nil
}

// Finite scans the synced gradients on the host and reports whether every value is finite. Under a strategy
// that splits buckets each rank holds only its block, so the ranks also agree on the answer (a collective
// then: every rank calls it at the same point).
func (r *Reducer) Finite() (bool, error) {
	if !r.Sharded() {
		return allVariablesFinite(r.accumulators)
	}
	sumSquares, err := r.SyncedSumSquares()
	if err != nil {
		return false, err
	}
	return !math.IsNaN(sumSquares) && !math.IsInf(sumSquares, 0), nil
}

func allVariablesFinite(vars []*context.Variable) (bool, error) {
	for _, v := range vars {
		t, err := v.Value()
		if err != nil {
			return false, err
		}
		finite := true
		err = t.ConstFlatData(func(flat any) {
			finite = floats.Do(flat, allFinite32, allFinite[float64])
		})
		if err != nil || !finite {
			return false, err
		}
	}
	return true, nil
}

// allFinite32 is allFinite on vec32's sum first: a sum is finite only when every term is (an infinity or a
// NaN among them makes it infinite or NaN), so a finite sum settles it in one vector pass; a sum that is not
// (a term that is not, or finite terms whose sum overflowed) is settled element by element.
func allFinite32(x []float32) bool {
	if s := vec32.Sum(x); s-s == 0 {
		return true
	}
	return allFinite(x)
}

func allFinite[F floats.Float](x []F) bool {
	for _, v := range x {
		if v-v != 0 { // NaN or ±Inf
			return false
		}
	}
	return true
}

// bucketTensors are the accumulators' current values.
func (r *Reducer) bucketTensors() ([]*tensors.Tensor, error) {
	if err := r.ClearSpent(); err != nil {
		return nil, err
	}
	return variableValues(r.accumulators)
}

func variableValues(vars []*context.Variable) ([]*tensors.Tensor, error) {
	values := make([]*tensors.Tensor, len(vars))
	for b, v := range vars {
		t, err := v.Value()
		if err != nil {
			return nil, fmt.Errorf("accumulate: %q: %w", v.ScopeAndName(), err)
		}
		values[b] = t
	}
	return values, nil
}

// reduce sums what this micro-batch syncs across ranks — the accumulators, or the gradients it emitted —
// into the accumulators in place, or into the shards under a strategy that splits buckets unless whole
// says to all-reduce the accumulators anyway (a sync-each-batch micro-batch that does not step).
func (r *Reducer) reduce(whole bool) error {
	send := r.emitted
	emitted := send != nil
	r.emitted = nil
	if send == nil {
		var err error
		if send, err = r.bucketTensors(); err != nil {
			return err
		}
	}
	if r.nonFinite {
		// A NaN loss on one rank must stop the step on every rank: poisoning the sum makes every rank see a
		// non-finite synced gradient, the same decision everywhere without another collective.
		poisonFirstElement(send[0])
		r.nonFinite, r.poisoned = false, true
	}
	if !r.Sharded() || whole {
		return r.syncWith(Replicated{}, send, send)
	}
	recv, err := variableValues(r.shards)
	if err != nil {
		return err
	}
	err = r.SyncInto(send, recv)
	if emitted {
		// The emitted gradients were this sync's alone: give their buffers back to the backend now (the
		// pure-Go backend pools them for the next step) rather than leave a whole model's gradient to the
		// garbage collector every step, which lets the heap grow to twice what is live.
		for _, t := range send {
			_ = t.FinalizeAll()
		}
	}
	return err
}

// sync reduces the accumulators and records the factor that turns their sum into the mean. A local
// reducer reduces nothing: the cycle's mean is this rank's own, and the count of syncs (collective rounds)
// does not move.
func (r *Reducer) sync() error {
	if r.local {
		r.emitted = nil
		r.poisoned, r.nonFinite = r.nonFinite, false
		r.synced = true
		r.scale = r.state.syncCorrection()
		r.state.ResetMicroBatches()
		return nil
	}
	if armed, err := r.finishOverlap(); err != nil {
		return err
	} else if armed {
		r.emitted = nil
		r.syncs++
	} else if err := r.reduce(false); err != nil {
		return err
	}
	r.synced = true
	r.scale = r.state.syncCorrection() / float64(r.comm.Size())
	r.state.ResetMicroBatches()
	return nil
}

// reduceMicroBatch all-reduces a micro-batch that does not step (sync each batch). The accumulators then
// hold the ranks' sum, identical on every rank; dividing it by the world size leaves each rank holding one
// N-th of it, so the next all-reduce, which adds every rank's share back, counts it exactly once beside
// the new micro-batch's gradients. The scale is applied on the host: the accumulators are there already
// after the all-reduce, and a power-of-two world size divides exactly.
func (r *Reducer) reduceMicroBatch() error {
	if err := r.reduce(true); err != nil {
		return err
	}
	size := r.comm.Size()
	if size == 1 {
		return nil
	}
	for b, v := range r.accumulators {
		t, err := v.Value()
		if err != nil {
			return fmt.Errorf("accumulate: accumulator %d: %w", b, err)
		}
		if err := t.MutableFlatData(func(flat any) { floats.Scale(flat, 1/float64(size)) }); err != nil {
			return fmt.Errorf("accumulate: accumulator %d: %w", b, err)
		}
	}
	return nil
}

// Sync sums the buckets across ranks, in place, through the comm hook and the sharding strategy. buckets[i]
// is bucket i's flat accumulator. Each bucket's communication starts as soon as that bucket is on the host,
// so fetching bucket i+1 (a device-to-host copy on an accelerator) overlaps the reduction of bucket i.
// Averaging is left to the caller, which folds the 1/world-size factor into the optimizer's update graph
// instead of another pass over the bytes.
//
// At world size 1 the sum is the identity and no engine call is made, but the sync is still counted: one
// sync per optimizer step is an invariant users check.
//
// Under a strategy that splits buckets Sync is SyncInto with the strategy's shards.
func (r *Reducer) Sync(buckets []*tensors.Tensor) error {
	if !r.Sharded() {
		return r.syncWith(r.sharding, buckets, buckets)
	}
	if len(r.shards) != len(r.plan.Buckets) {
		return fmt.Errorf("accumulate: the %s strategy syncs into shards, and the reducer has none", r.sharding.Name())
	}
	recv, err := variableValues(r.shards)
	if err != nil {
		return err
	}
	return r.SyncInto(buckets, recv)
}

// SyncInto sums the buckets across ranks into recv under a strategy that splits buckets: recv[i] receives
// this rank's block of bucket i (BlockLen elements; buckets[i] is laid out Sharding.Padded long). At world
// size 1 the block is the bucket, copied.
func (r *Reducer) SyncInto(buckets, recv []*tensors.Tensor) error {
	return r.syncWith(r.sharding, buckets, recv)
}

func (r *Reducer) syncWith(sharding Sharding, buckets, recv []*tensors.Tensor) error {
	if len(buckets) != len(r.plan.Buckets) || len(recv) != len(buckets) {
		return fmt.Errorf("accumulate: %d bucket tensors (%d to receive into) for a plan of %d buckets",
			len(buckets), len(recv), len(r.plan.Buckets))
	}
	inPlace := sharding.Stage() == 0
	if r.comm.Size() > 1 || !inPlace {
		pending := make([]Waiter, 0, len(buckets))
		waitAll := func() error {
			var firstErr error
			for _, p := range pending {
				if err := p.Wait(); err != nil && firstErr == nil {
					firstErr = err
				}
			}
			return firstErr
		}
		size := r.comm.Size()
		for i, t := range buckets {
			layout := r.plan.Buckets[i]
			buf, err := hostBuffer(t)
			if err != nil {
				_ = waitAll()
				return fmt.Errorf("accumulate: bucket %d: %w", i, err)
			}
			shard := buf
			if !inPlace {
				if shard, err = hostBuffer(recv[i]); err != nil {
					_ = waitAll()
					return fmt.Errorf("accumulate: shard of bucket %d: %w", i, err)
				}
				padded := sharding.Padded(layout.Size, size)
				if buf.Len != padded || shard.Len != padded/size {
					_ = waitAll()
					return fmt.Errorf("accumulate: bucket %d of %d elements is sent as %d and received as %d; the "+
						"%s strategy lays it out as %d, %d per rank", i, layout.Size, buf.Len, shard.Len,
						sharding.Name(), padded, padded/size)
				}
				if size == 1 {
					copyBuffer(shard, buf)
					continue
				}
			}
			r.comm.SetNextLabel(backends.BucketLabel(i, int64(layout.Bytes())))
			p, err := r.hook.Start(r.comm, sharding, GradBucket{Index: i, Layout: layout, Params: r.plan.Params,
				Buffer: buf, Shard: shard})
			if err != nil {
				_ = waitAll()
				return fmt.Errorf("accumulate: %s of bucket %d (%d bytes): %w", reductionName(sharding), i,
					layout.Bytes(), err)
			}
			pending = append(pending, p)
		}
		if err := waitAll(); err != nil {
			return fmt.Errorf("accumulate: gradient sync: %w", err)
		}
		// The engines wrote into the tensors' memory; keep the tensors alive until here.
		runtime.KeepAlive(buckets)
		runtime.KeepAlive(recv)
	}
	r.syncs++
	return nil
}

func reductionName(s Sharding) string {
	if s.Stage() == 0 {
		return "all-reduce"
	}
	return "reduce-scatter"
}

// copyBuffer copies src's first dst.Len elements into dst (same kind).
func copyBuffer(dst, src backends.Buffer) {
	copy(unsafe.Slice((*byte)(dst.Ptr), dst.Bytes), unsafe.Slice((*byte)(src.Ptr), src.Bytes))
}

// HostBuffer is a tensor's flat storage on the host, classified for the engines: where a collective reads
// and writes it in place (see hostFlat). The buffer stays valid while t is neither finalized nor written
// by anyone else.
func HostBuffer(t *tensors.Tensor) (backends.Buffer, error) { return hostBuffer(t) }

// hostBuffer is hostFlat classified for the engines.
func hostBuffer(t *tensors.Tensor) (backends.Buffer, error) {
	flat, err := hostFlat(t)
	if err != nil {
		return backends.Buffer{}, err
	}
	return backends.Elements(flat)
}

// hostFlat returns the tensor's flat storage on the host, for the engine to reduce in place.
//
// On a backend whose buffers are host memory (the pure-Go backend, XLA on CPU) a tensor that lives only in
// its device buffer is reduced right there: BufferData is that buffer's memory, so the sum lands where the
// next graph execution reads it. Going through MutableFlatData instead would copy the buffer into a new
// host slice and upload it again on the next use, a fresh allocation per bucket per sync (docs/notes.md,
// Note [in-place bucket sums]).
//
// Anywhere else MutableFlatData brings the data to the host (a device-to-host copy on an accelerator) and
// marks the device copy stale, so the reduced values are uploaded again when next used. Either way the
// slice stays valid after this returns because the tensor owns it and is neither finalized nor written by
// anyone else until the sync completes.
func hostFlat(t *tensors.Tensor) (any, error) {
	if !t.IsLocal() && t.IsOnDevice(0) {
		if backend, err := t.Backend(); err == nil && backend.HasSharedBuffers() {
			buffer, err := t.Buffer(backend, 0)
			if err != nil {
				return nil, err
			}
			return backend.BufferData(buffer)
		}
	}
	var flat any
	if err := t.MutableFlatData(func(f any) { flat = f }); err != nil {
		return nil, err
	}
	return flat, nil
}

// poisonFirstElement writes NaN into the first element of a float bucket.
func poisonFirstElement(t *tensors.Tensor) {
	_ = t.MutableFlatData(func(flat any) {
		floats.Do(flat, poisonFirst[float32], poisonFirst[float64])
	})
}

func poisonFirst[F floats.Float](x []F) bool {
	if len(x) > 0 {
		x[0] = F(math.NaN())
	}
	return true
}

// ReducerState is what a checkpoint keeps of a reducer: this rank's partial sums, bucket by bucket, and
// whether they hold a partial accumulation cycle.
type ReducerState struct {
	// Accumulators are the raw bytes of each bucket's accumulator on this rank.
	Accumulators [][]byte
	SavedAccumulators
}

// SavedAccumulators is what a checkpoint's state.json records of a model's accumulators, beside the file
// that holds every rank's partial sums.
type SavedAccumulators struct {
	// Accumulating says the accumulators hold micro-batches of an unfinished cycle.
	Accumulating bool `json:"accumulating"`
}

// ErrSyncedNotApplied is State's error when the accumulators hold synchronised gradients that the
// optimizer has not applied: such a state would be applied twice, or not at all, after a resume.
var ErrSyncedNotApplied = errors.New("accumulate: synced gradients were not applied; save after the optimizer's Step")

// State returns the reducer's checkpointable state.
func (r *Reducer) State() (ReducerState, error) {
	if err := r.forModel(); err != nil {
		return ReducerState{}, err
	}
	if r.synced {
		return ReducerState{}, ErrSyncedNotApplied
	}
	s := ReducerState{SavedAccumulators: SavedAccumulators{Accumulating: r.state.MicroBatchesSinceSync() > 0}}
	sizes := r.AccumulatorBytes()
	if r.accumulators == nil {
		// Never made (ShardGradients with no micro-batch accumulated yet): zeros, as they would hold.
		for _, n := range sizes {
			s.Accumulators = append(s.Accumulators, make([]byte, n))
		}
		return s, nil
	}
	if err := r.ClearSpent(); err != nil {
		return s, err
	}
	for b, v := range r.accumulators {
		t, err := v.Value()
		if err != nil {
			return s, fmt.Errorf("accumulator %q: %w", v.ScopeAndName(), err)
		}
		// The bucket's own elements, without the padding a strategy that splits buckets lays it out with.
		var data []byte
		if err := t.ConstBytes(func(b []byte) { data = append([]byte(nil), b[:min(len(b), sizes[len(s.Accumulators)])]...) }); err != nil {
			return s, fmt.Errorf("accumulator %q: %w", v.ScopeAndName(), err)
		}
		if len(data) != sizes[b] {
			return s, fmt.Errorf("accumulator %q has %d bytes, bucket %d needs %d", v.ScopeAndName(), len(data), b, sizes[b])
		}
		s.Accumulators = append(s.Accumulators, data)
	}
	return s, nil
}

// AccumulatorBytes is the size in bytes of each bucket's accumulator, what State's Accumulators hold.
func (r *Reducer) AccumulatorBytes() []int {
	sizes := make([]int, len(r.plan.Buckets))
	for b, bucket := range r.plan.Buckets {
		sizes[b] = bucket.Bytes()
	}
	return sizes
}

// CheckRestore returns the error Restore would return for s, without changing anything.
func (r *Reducer) CheckRestore(s ReducerState) error {
	if err := r.forModel(); err != nil {
		return err
	}
	sizes := r.AccumulatorBytes()
	if len(s.Accumulators) != len(sizes) {
		return fmt.Errorf("accumulate: %d saved accumulators for a plan of %d buckets", len(s.Accumulators), len(sizes))
	}
	for b, data := range s.Accumulators {
		if len(data) != sizes[b] {
			return fmt.Errorf("accumulate: saved accumulator %d has %d bytes, the bucket needs %d", b, len(data), sizes[b])
		}
	}
	return nil
}

// Restore sets the accumulators to s's partial sums and marks them as holding a partial cycle (or not).
func (r *Reducer) Restore(s ReducerState) error {
	if err := r.CheckRestore(s); err != nil {
		return err
	}
	if r.accumulators == nil && s.Accumulating {
		if r.makeAccumulators == nil {
			return errors.New("accumulate: restoring a partial cycle needs accumulators, and the reducer has none")
		}
		vars, err := r.makeAccumulators()
		if err != nil {
			return err
		}
		if err := r.SetAccumulators(vars); err != nil {
			return err
		}
	}
	for b, v := range r.accumulators {
		value, err := v.Value()
		if err != nil {
			return fmt.Errorf("accumulator %q: %w", v.ScopeAndName(), err)
		}
		if err := value.MutableBytes(func(data []byte) { copy(data, s.Accumulators[b]) }); err != nil {
			return fmt.Errorf("accumulator %q: %w", v.ScopeAndName(), err)
		}
	}
	// Dirty from the bytes too: Accumulating counts the shared gradient state's micro-batches, and a model
	// that skipped the micro-batch another model synced on holds sums with that count at 0. A micro-step
	// that finds its accumulators clean sets them instead of adding into them.
	dirty := s.Accumulating
	for _, saved := range s.Accumulators {
		dirty = dirty || slices.ContainsFunc(saved, func(b byte) bool { return b != 0 })
	}
	r.dirty, r.synced, r.nonFinite, r.spent = dirty, false, false, false
	return nil
}

// GatherState gathers every rank's accumulators of s (this rank's State) onto the main process (rank 0),
// bucket by bucket and, within a bucket, rank by rank: the layout SavedState reads. Other ranks get nil.
// Collective.
func (r *Reducer) GatherState(s ReducerState) ([]byte, error) {
	var blob []byte
	size := r.comm.Size()
	for b, data := range s.Accumulators {
		all := make([]byte, len(data)*size)
		if size == 1 {
			copy(all, data)
		} else if err := r.comm.AllGather(backends.BufferOf(data), backends.BufferOf(all)); err != nil {
			return nil, fmt.Errorf("accumulate: gathering accumulator %q: %w", r.accumulators[b].ScopeAndName(), err)
		}
		if r.comm.Rank() == 0 {
			blob = append(blob, all...)
		}
	}
	return blob, nil
}

// SavedState returns this rank's ReducerState from a checkpoint's gathered accumulators (GatherState's
// layout, written by savedRanks ranks; accumulating as the checkpoint recorded). On the saved number of
// ranks each rank gets its own partial sums back. On another number only a checkpoint at an optimizer-step
// boundary fits: every rank's accumulators were empty, and each rank of this run starts with empty ones.
// A partial cycle there is ErrInsideCycle: the partial sums of ranks that no longer exist cannot be
// placed.
func (r *Reducer) SavedState(blob []byte, savedRanks int, accumulating bool) (ReducerState, error) {
	if err := r.forModel(); err != nil {
		return ReducerState{}, err
	}
	if savedRanks < 1 {
		return ReducerState{}, fmt.Errorf("accumulate: accumulators saved by %d ranks", savedRanks)
	}
	sizes := r.AccumulatorBytes()
	total := 0
	for _, n := range sizes {
		total += n * savedRanks
	}
	if len(blob) != total {
		return ReducerState{}, fmt.Errorf("accumulate: the saved accumulators are %d bytes, the model's buckets "+
			"on %d ranks need %d", len(blob), savedRanks, total)
	}
	size, rank := r.comm.Size(), r.comm.Rank()
	if savedRanks != size && accumulating {
		return ReducerState{}, fmt.Errorf("%w: the accumulators hold the partial sums of %d processes and this "+
			"run has %d; save at an optimizer-step boundary to resume on another number of processes",
			ErrInsideCycle, savedRanks, size)
	}
	mine := ReducerState{SavedAccumulators: SavedAccumulators{Accumulating: accumulating}}
	offset := 0
	for _, n := range sizes {
		if savedRanks == size {
			mine.Accumulators = append(mine.Accumulators, blob[offset+rank*n:offset+(rank+1)*n])
		} else {
			mine.Accumulators = append(mine.Accumulators, make([]byte, n))
		}
		offset += n * savedRanks
	}
	return mine, nil
}
