package accumulate

import (
	"fmt"
	"runtime"

	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/backends"
)

// Reducer all-reduces a plan's bucket accumulators across ranks.
type Reducer struct {
	comm *backends.Communicator
	plan Plan

	syncs int64
}

// NewReducer returns a reducer for plan over comm.
func NewReducer(comm *backends.Communicator, plan Plan) *Reducer {
	return &Reducer{comm: comm, plan: plan}
}

// Plan is the bucket plan this reducer serves.
func (r *Reducer) Plan() Plan { return r.plan }

// Syncs is the number of syncs performed.
func (r *Reducer) Syncs() int64 { return r.syncs }

// Sync sums the buckets across ranks, in place. buckets[i] is bucket i's flat accumulator. Each bucket's
// all-reduce starts as soon as that bucket is on the host, so fetching bucket i+1 (a device-to-host copy on
// an accelerator) overlaps the reduction of bucket i. Averaging is left to the caller, which folds the
// 1/world-size factor into the optimizer's update graph instead of another pass over the bytes.
//
// At world size 1 the sum is the identity and no engine call is made, but the sync is still counted: one
// sync per optimizer step is an invariant users check.
func (r *Reducer) Sync(buckets []*tensors.Tensor) error {
	if len(buckets) != len(r.plan.Buckets) {
		return fmt.Errorf("accumulate: %d bucket tensors for a plan of %d buckets", len(buckets), len(r.plan.Buckets))
	}
	if r.comm.Size() > 1 {
		pending := make([]*backends.Pending, 0, len(buckets))
		waitAll := func() error {
			var firstErr error
			for _, p := range pending {
				if err := p.Wait(); err != nil && firstErr == nil {
					firstErr = err
				}
			}
			return firstErr
		}
		for i, t := range buckets {
			flat, err := hostFlat(t)
			if err != nil {
				_ = waitAll()
				return fmt.Errorf("accumulate: bucket %d: %w", i, err)
			}
			p, err := r.comm.AllReduceSumAsync(flat)
			if err != nil {
				_ = waitAll()
				return fmt.Errorf("accumulate: all-reduce of bucket %d (%d bytes): %w", i, r.plan.Buckets[i].Bytes(), err)
			}
			pending = append(pending, p)
		}
		if err := waitAll(); err != nil {
			return fmt.Errorf("accumulate: gradient sync: %w", err)
		}
		// The engines wrote into the tensors' memory; keep the tensors alive until here.
		runtime.KeepAlive(buckets)
	}
	r.syncs++
	return nil
}

// hostFlat returns the tensor's flat storage on the host, for the engine to reduce in place.
//
// On a backend whose buffers are host memory (the pure-Go backend, XLA on CPU) a tensor that lives only in
// its device buffer is reduced right there: BufferData is that buffer's memory, so the sum lands where the
// next graph execution reads it. Going through MutableFlatData instead would copy the buffer into a new
// host slice and upload it again on the next use: for the demo's MLP, 400 KB allocated per sync, which
// was 40% of its training garbage and made the collector's heap grow onto fresh pages.
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
