package prepare

import (
	"fmt"
	"runtime"
	"unsafe"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/initializers"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/blockstate"
)

// Under a strategy that splits buckets (ZeRO stages 1 and 2) the optimizer updates this rank's block of
// every bucket only. Its trainable variables are then the parameter blocks, one flat variable per bucket
// in blockstate.Scope, so GoMLX's optimizer makes its state (Adam's moments…) shaped like the blocks: 1/N of
// the replicated state. Every optimizer GoMLX ships updates each element from that element's gradient,
// value and state alone, so updating a block gives the same values as updating the whole parameter there.
//
// A step: the parameter blocks are refreshed from the parameters (which anything may have written: a
// restore, a per-step update), the update runs on the blocks with the gradient blocks the reduce-scatter
// left in the model's gradShards, and the updated blocks are all-gathered, bucket by bucket, into the
// parameters.

// buildShards makes the parameter blocks (BlockLen elements per bucket, zero: refreshed before each use).
func (o *Optimizer) buildShards() {
	m := o.model
	if m.sharding.Stage() == 0 || o.paramShards != nil {
		return
	}
	shardCtx := m.ctx.InAbsPath(blockstate.Scope).Checked(false).WithInitializer(initializers.Zero)
	size := m.rt.Comm.Size()
	o.paramShards = make([]*context.Variable, len(m.plan.Buckets))
	for b, bucket := range m.plan.Buckets {
		o.paramShards[b] = shardCtx.VariableWithShape(blockstate.ParamBlockName(b),
			shapes.Make(bucket.DType, accumulate.BlockLen(bucket.Size, size)))
	}
}

// applyShardedGraph is applyGraph for a strategy that splits buckets: the optimizer sees the parameter
// blocks as its only trainable variables, with the mean of the gradient blocks, clipped by clip (the factor
// for the global norm, computed across ranks before the step; 1 without clipping).
func (o *Optimizer) applyShardedGraph(ctx *context.Context, scale, clip *Node) {
	m := o.model
	g := scale.Graph()
	ctx.SetTraining(g, true)
	grads := trainedWith(g, o.paramShards, m.gradShards, scale)
	if o.clipNorm > 0 {
		for b, grad := range grads {
			grads[b] = Mul(grad, ConvertDType(clip, grad.DType()))
		}
	}
	o.withGrads.UpdateGraphWithGradients(ctx, grads, m.lossDType)
}

// perStepGraph runs the model's per-step updates (train.AddPerStepUpdateGraphFn) on the whole parameters,
// after the all-gather: under a strategy that splits buckets the update graph sees blocks only.
func (o *Optimizer) perStepGraph(ctx *context.Context, scale *Node) {
	g := scale.Graph()
	ctx.SetTraining(g, true)
	for _, u := range o.model.perStepUpdates {
		u.fn(ctx.InAbsPath(u.scope), g)
	}
}

// shardCopy moves elements between the parameters and a bucket's flat layout: elements [from, to) of
// bucket b, and flat, which holds them from its first element (toFlat: parameters → flat, else back).
func shardCopy(m *Model, b, from, to int, flat backends.Buffer, toFlat bool) error {
	bucket := m.plan.Buckets[b]
	elem := bucket.DType.Size()
	flatBytes := unsafe.Slice((*byte)(flat.Ptr), flat.Bytes)
	for _, slot := range bucket.Slots {
		lo, hi := max(from, slot.Offset), min(to, slot.Offset+slot.Size)
		if lo >= hi {
			continue
		}
		t, err := m.params[slot.Param].Value()
		if err != nil {
			return fmt.Errorf("prepare: parameter %q: %w", m.params[slot.Param].ScopeAndName(), err)
		}
		param, err := accumulate.HostBuffer(t)
		if err != nil {
			return fmt.Errorf("prepare: parameter %q: %w", m.params[slot.Param].ScopeAndName(), err)
		}
		paramBytes := unsafe.Slice((*byte)(param.Ptr), param.Bytes)
		p := paramBytes[(lo-slot.Offset)*elem : (hi-slot.Offset)*elem]
		f := flatBytes[(lo-from)*elem : (hi-from)*elem]
		if toFlat {
			copy(f, p)
		} else {
			copy(p, f)
		}
		runtime.KeepAlive(t)
	}
	return nil
}

// refreshShards copies this rank's block of every bucket from the parameters into the parameter blocks
// (the padding past the bucket's end stays zero).
func (o *Optimizer) refreshShards() error {
	m := o.model
	size, rank := m.rt.Comm.Size(), m.rt.Comm.Rank()
	for b, v := range o.paramShards {
		t, err := v.Value()
		if err != nil {
			return fmt.Errorf("prepare: parameter block %d: %w", b, err)
		}
		buf, err := accumulate.HostBuffer(t)
		if err != nil {
			return fmt.Errorf("prepare: parameter block %d: %w", b, err)
		}
		clear(unsafe.Slice((*byte)(buf.Ptr), buf.Bytes))
		from, to := m.sharding.Owned(m.plan.Buckets[b].Size, rank, size)
		if err := shardCopy(m, b, from, to, buf, true); err != nil {
			return err
		}
		runtime.KeepAlive(t)
	}
	return nil
}

// gatherShards all-gathers the updated parameter blocks into the parameters, bucket by bucket. A bucket that
// is one parameter laid out without padding (every large parameter: it has a bucket of its own) is gathered
// straight into the parameter's memory; the others go through one of two reused buffers the size of the
// largest such bucket, and are copied into their parameters while the next bucket's gather runs: the whole
// model is never held twice.
func (o *Optimizer) gatherShards() error {
	m := o.model
	comm := m.rt.Comm
	size := comm.Size()
	direct := make([]*tensors.Tensor, len(o.paramShards)) // the parameter a bucket gathers into, if it does
	largest := 0
	for b, bucket := range m.plan.Buckets {
		padded := m.sharding.Padded(bucket.Size, size)
		if len(bucket.Slots) == 1 && padded == bucket.Size {
			t, err := m.params[bucket.Slots[0].Param].Value()
			if err != nil {
				return err
			}
			direct[b] = t
			continue
		}
		largest = max(largest, padded*bucket.DType.Size())
	}
	for i := range o.gathered {
		if len(o.gathered[i]) < largest {
			o.gathered[i] = make([]byte, largest)
		}
	}
	blocks := make([]*tensors.Tensor, len(o.paramShards))
	start := func(b int) (*backends.Pending, error) {
		t, err := o.paramShards[b].Value()
		if err != nil {
			return nil, err
		}
		blocks[b] = t
		send, err := accumulate.HostBuffer(t)
		if err != nil {
			return nil, err
		}
		if direct[b] != nil {
			recv, err := accumulate.HostBuffer(direct[b])
			if err != nil {
				return nil, err
			}
			return comm.AllGatherAsync(send, recv)
		}
		recv := backends.Buffer{Kind: send.Kind, Len: send.Len * size, Bytes: send.Bytes * size,
			Ptr: unsafe.Pointer(&o.gathered[b%2][0])}
		return comm.AllGatherAsync(send, recv)
	}
	pending, err := start(0)
	for b := range o.paramShards {
		if err != nil {
			return fmt.Errorf("prepare: all-gather of parameter block %d: %w", b, err)
		}
		if err := pending.Wait(); err != nil {
			return fmt.Errorf("prepare: all-gather of parameter block %d: %w", b, err)
		}
		// Waited: the other staging buffer is free for the next bucket's gather.
		if b+1 < len(o.paramShards) {
			pending, err = start(b + 1)
		}
		if direct[b] != nil {
			continue
		}
		bucket := m.plan.Buckets[b]
		whole := backends.Buffer{Len: bucket.Size, Bytes: bucket.Size * bucket.DType.Size(),
			Ptr: unsafe.Pointer(&o.gathered[b%2][0])}
		if copyErr := shardCopy(m, b, 0, bucket.Size, whole, false); copyErr != nil {
			if err == nil && b+1 < len(o.paramShards) {
				_ = pending.Wait() // the engine must be done with the staging buffer before it is dropped
			}
			return copyErr
		}
	}
	runtime.KeepAlive(blocks)
	runtime.KeepAlive(direct)
	return nil
}
