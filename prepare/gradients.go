package prepare

import (
	"errors"
	"fmt"
	"math"

	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/internal/floats"
)

// Gradients returns the model's gradient for every parameter, keyed by the variable's scope and name (as
// reading .grad in PyTorch). After a sync, until the optimizer's Step or ZeroGrad, it is the averaged
// gradient the optimizer will apply (before any clipping the optimizer does itself): the same on every
// rank. Before a sync it is this rank's local accumulation so far, each micro-batch scaled as Backward
// added it (1/K inside Accumulate); with sync-each-batch, micro-batches already all-reduced count there as
// their mean over the ranks. The tensors are copies.
func (m *Model) Gradients() (map[string]*tensors.Tensor, error) {
	if !m.materialized {
		return nil, errors.New("prepare: gradients before the model was built: run Backward first")
	}
	if m.reducer.Sharded() && m.reducer.Synced() {
		return nil, fmt.Errorf("prepare: the synced gradients are split between the processes (sharding %q): "+
			"each holds its block only; read them with replicated sharding, or before the sync", m.sharding.Name())
	}
	if m.buckets == nil {
		return nil, errors.New("prepare: no gradients accumulated since the last step (sharding \"gradients\" " +
			"sends a micro-batch's gradients straight to the sync)")
	}
	// Sums the last step applied read as zeros.
	if err := m.reducer.ClearSpent(); err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	factor := 1.0
	if m.reducer.Synced() {
		factor = m.reducer.Scale()
	}
	grads := make(map[string]*tensors.Tensor, len(m.params))
	for b, bucket := range m.plan.Buckets {
		value, err := m.buckets[b].Value()
		if err != nil {
			return nil, fmt.Errorf("prepare: accumulator %d: %w", b, err)
		}
		err = value.ConstFlatData(func(flat any) {
			for _, slot := range bucket.Slots {
				param := m.plan.Params[slot.Param]
				floats.Do(flat, gradientPart[float32](grads, param, slot, factor),
					gradientPart[float64](grads, param, slot, factor))
			}
		})
		if err != nil {
			return nil, fmt.Errorf("prepare: accumulator %d: %w", b, err)
		}
	}
	return grads, nil
}

// ClipGradNorm scales the synced gradients so that their global L2 norm is at most maxNorm, as
// torch.nn.utils.clip_grad_norm_ does (factor maxNorm/(norm+1e-6) when it is below 1), and returns their
// norm before clipping. Call it between a syncing Backward and the optimizer's Step: it works on the
// averaged gradients, the same on every rank, so every rank clips identically without communicating. On
// calls that did not sync it does nothing and returns 0, like Step.
func (m *Model) ClipGradNorm(maxNorm float64) (norm float64, err error) {
	if !(maxNorm > 0) {
		return 0, fmt.Errorf("prepare: gradient clipping norm must be positive, got %g", maxNorm)
	}
	if !m.reducer.Synced() {
		return 0, nil
	}
	// Under a strategy that splits buckets each rank holds a block of the sums: the ranks add their parts.
	sumSquares, err := m.reducer.SyncedSumSquares()
	if err != nil {
		return 0, fmt.Errorf("prepare: %w", err)
	}
	norm = math.Sqrt(sumSquares) * m.reducer.Scale()
	if factor := maxNorm / (norm + 1e-6); factor < 1 {
		err = m.eachBucket(func(f []float32) { floats.Scale(f, factor) }, func(f []float64) { floats.Scale(f, factor) })
	}
	return norm, err
}

// ClipGradValue clamps every synced gradient value to [-clip, clip] (torch.nn.utils.clip_grad_value_).
// Like ClipGradNorm it works on the averaged gradients between a syncing Backward and Step, and does
// nothing on calls that did not sync.
func (m *Model) ClipGradValue(clip float64) error {
	if !(clip > 0) || math.IsInf(clip, 0) {
		return fmt.Errorf("prepare: gradient clipping value must be a positive number, got %g", clip)
	}
	if !m.reducer.Synced() {
		return nil
	}
	// The accumulators hold the sum the optimizer scales by the reducer's scale: clamp the sum to
	// clip/scale.
	limit := clip / m.reducer.Scale()
	return m.eachBucket(discard(clamp[float32](limit)), discard(clamp[float64](limit)))
}

// eachBucket runs fn on every accumulator's flat values, which fn may change, in place (see
// accumulate.Reducer.EachAccumulator): clipping reads and scales the synced sums where the optimizer's update
// reads them.
func (m *Model) eachBucket(f32 func([]float32), f64 func([]float64)) error {
	if err := m.reducer.EachAccumulator(f32, f64); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	return nil
}

// gradientPart copies one parameter's slot out of a bucket, times factor, into grads.
func gradientPart[F floats.Float](grads map[string]*tensors.Tensor, param accumulate.Param, slot accumulate.Slot,
	factor float64) func([]F) bool {
	return func(f []F) bool {
		part := make([]F, slot.Size)
		for i := range part {
			part[i] = F(float64(f[slot.Offset+i]) * factor)
		}
		grads[param.Name] = tensors.FromFlatDataAndDimensions(part, param.Shape.Dimensions...)
		return true
	}
}

func clamp[F floats.Float](limit float64) func([]F) bool {
	return func(f []F) bool {
		for i, x := range f {
			f[i] = F(max(min(float64(x), limit), -limit))
		}
		return true
	}
}

// discard adapts a floats.Do-style function (whose result says it ran) to EachAccumulator's.
func discard[F floats.Float](fn func([]F) bool) func([]F) { return func(x []F) { fn(x) } }
