package accumulate

import (
	"fmt"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/vec32"
)

// EachAccumulator runs f32 on each float32 bucket accumulator's values and f64 on each float64 one, in
// place: on a backend whose buffers are host memory the slice is the backend's own buffer (no copy to the
// host and back, see hostFlat), elsewhere a host copy that the next graph execution uploads. The functions
// may change the values (gradient clipping does); they must not keep the slice.
//
// Once a sync under a strategy that splits buckets left this rank its block of the synced sums, the
// functions see that block instead (its real elements, without padding): what the optimizer's update reads.
func (r *Reducer) EachAccumulator(f32 func([]float32), f64 func([]float64)) error {
	if err := r.ClearSpent(); err != nil {
		return err
	}
	vars := r.accumulators
	if r.Sharded() && r.synced {
		vars = r.shards
	}
	for b, v := range vars {
		t, err := v.Value()
		if err != nil {
			return fmt.Errorf("accumulate: accumulator %d: %w", b, err)
		}
		flat, err := hostFlat(t)
		if err != nil {
			return fmt.Errorf("accumulate: accumulator %d: %w", b, err)
		}
		n := r.plan.Buckets[b].Size
		if r.Sharded() && r.synced {
			from, to := r.sharding.Owned(n, r.comm.Rank(), r.comm.Size())
			n = to - from
		}
		switch values := flat.(type) {
		case []float32:
			f32(values[:n])
		case []float64:
			f64(values[:n])
		default:
			return fmt.Errorf("accumulate: accumulator %d holds %T, not float32 or float64 values", b, flat)
		}
	}
	return nil
}

// SyncedSumSquares is the sum of the squares of the synced gradient sums, in float64 (NaN or Inf when one
// of them is not finite): what clipping by global norm and the check for non-finite values read. Under a
// strategy that splits buckets each rank holds its block only, and the ranks add their parts: a
// collective then, which every rank calls at the same point.
func (r *Reducer) SyncedSumSquares() (float64, error) {
	sum := []float64{0}
	err := r.EachAccumulator(func(f []float32) { sum[0] += vec32.SumSquares(f) }, func(f []float64) {
		for _, x := range f {
			sum[0] += x * x
		}
	})
	if err != nil {
		return 0, err
	}
	if r.Sharded() && r.comm.Size() > 1 {
		if err := r.comm.AllReduceSum(backends.BufferOf(sum)); err != nil {
			return 0, fmt.Errorf("accumulate: the gradients' norm across ranks: %w", err)
		}
	}
	return sum[0], nil
}
