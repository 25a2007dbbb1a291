package prepare

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/dtypes/bfloat16"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/x448/float16"

	"github.com/goaccel/goaccel/backends"
)

// A model's buffers are the variables its training step changes that are not trained: they move with the
// forward pass, not with the gradients. Batch normalisation's moving mean and variance (and its count of
// updates, avg_weight) are the common case: GoMLX's batchnorm.New keeps them as non-trainable variables that
// every training forward updates from its batch, and Predict normalises with them.
//
// Averaged gradients keep the weights identical on every rank, but each rank updates its buffers from its
// own batches, so left alone they drift apart, and each rank would evaluate with its own. A prepared model
// therefore synchronises its buffers at every gradient sync that an optimizer step follows (see BufferSync):
// by default every rank takes rank 0's (PyTorch DDP's broadcast_buffers), or with AverageBuffers their mean.
//
// The random number generator state is not a buffer (it is per rank by design, see RNGVariable), nor is the
// optimizer's state (written by the optimizer step, identical on every rank because every rank applies the
// same averaged gradient), nor a learning-rate schedule in the optimizer's scope, nor goaccel's gradient
// accumulators.

// BufferSync says how a prepared model keeps its buffers identical across ranks.
type BufferSync int

const (
	// BroadcastBuffers gives every rank rank 0's buffers at each gradient sync that an optimizer step
	// follows: PyTorch DDP's default (broadcast_buffers=True), which broadcasts before every forward; where
	// buffers are only read outside training, as batch normalisation's are, once per optimizer step leaves
	// the same values. Works for buffers of any dtype and update rule. The default.
	BroadcastBuffers BufferSync = iota
	// AverageBuffers gives every rank the mean of the ranks' floating-point buffers at the same points, so
	// the statistics reflect every rank's examples; buffers of other dtypes (counters) take rank 0's.
	AverageBuffers
	// NoBufferSync leaves each rank its own buffers: they are per rank, like the generator state, and the
	// replica checks leave them out. Checkpoints hold rank 0's.
	NoBufferSync
)

func (s BufferSync) String() string {
	switch s {
	case BroadcastBuffers:
		return "broadcast"
	case AverageBuffers:
		return "average"
	case NoBufferSync:
		return "none"
	}
	return fmt.Sprintf("BufferSync(%d)", int(s))
}

// Valid reports whether s is one of BroadcastBuffers, AverageBuffers and NoBufferSync.
func (s BufferSync) Valid() bool { return s >= BroadcastBuffers && s <= NoBufferSync }

// BufferSyncMode sets how the model keeps its buffers identical across ranks (default BroadcastBuffers).
func BufferSyncMode(mode BufferSync) ModelOption { return func(m *Model) { m.bufferSync = mode } }

// BufferSync is how the model keeps its buffers identical across ranks.
func (m *Model) BufferSync() BufferSync { return m.bufferSync }

// Buffers are the non-trainable variables the model's training step changes (batch normalisation's moving
// averages), in registration order (valid once materialised; empty for a model without any).
func (m *Model) Buffers() []*context.Variable { return slices.Clone(m.buffers) }

// bufferVariables are the variables the training graph g changes that are buffers: neither trainable,
// nor goaccel's accumulators, nor the generator state, nor in an optimizer's scope.
func bufferVariables(ctx *context.Context, g *Graph) []*context.Variable {
	var vars []*context.Variable
	for v := range ctx.IterVariables() {
		if v.Trainable || isBucketVariable(v) || isRNGVariable(v) || !v.ChangedInGraph(g) {
			continue
		}
		if slices.Contains(strings.Split(v.Scope(), context.ScopeSeparator), optimizers.Scope) {
			continue
		}
		vars = append(vars, v)
	}
	return vars
}

// perRankBuffers are the buffers the ranks do not keep identical (all of them with NoBufferSync).
func (m *Model) perRankBuffers() []*context.Variable {
	if m.bufferSync != NoBufferSync {
		return nil
	}
	return m.buffers
}

// isPerRankBuffer reports whether v is one of the buffers each rank keeps for itself.
func (m *Model) isPerRankBuffer(v *context.Variable) bool {
	return m.bufferSync == NoBufferSync && slices.Contains(m.buffers, v)
}

// SyncBuffers makes the model's buffers identical on every rank now, as mode says (NoBufferSync does
// nothing). Backward calls it with the model's own mode at every gradient sync an optimizer step follows;
// call it yourself to evaluate with common buffers at another point, for example with AverageBuffers
// before evaluating a model prepared with NoBufferSync. Collective: every rank must call it, with the same
// mode.
func (m *Model) SyncBuffers(mode BufferSync) (err error) {
	defer recovered("prepare: synchronising buffers", &err)
	if !mode.Valid() {
		return fmt.Errorf("prepare: buffer sync must be BroadcastBuffers, AverageBuffers or NoBufferSync, got %s", mode)
	}
	if err := m.rt.checkOpen("SyncBuffers"); err != nil {
		return err
	}
	if !m.materialized || len(m.buffers) == 0 || mode == NoBufferSync || m.rt.Comm.Size() == 1 {
		return nil
	}
	var averaged, broadcast []*context.Variable
	for _, v := range m.buffers {
		switch {
		case v.Shape().Size() == 0:
		case mode == AverageBuffers && isFloat(v.DType()):
			averaged = append(averaged, v)
		default:
			broadcast = append(broadcast, v)
		}
	}
	if err := averageVariables(m.rt.Comm, averaged); err != nil {
		return err
	}
	return broadcastVariables(m.rt.Comm, broadcast)
}

func isFloat(dt dtypes.DType) bool {
	switch dt {
	case dtypes.Float16, dtypes.BFloat16, dtypes.Float32, dtypes.Float64:
		return true
	}
	return false
}

// broadcastVariables gives every rank rank 0's values of vars, in one broadcast of their bytes.
func broadcastVariables(comm *backends.Communicator, vars []*context.Variable) error {
	if len(vars) == 0 {
		return nil
	}
	size := 0
	for _, v := range vars {
		size += int(v.Shape().Memory())
	}
	packed := make([]byte, size)
	root := comm.Rank() == 0
	if root {
		at := 0
		for _, v := range vars {
			t, err := v.Value()
			if err == nil {
				err = t.ConstBytes(func(data []byte) { at += copy(packed[at:], data) })
			}
			if err != nil {
				return fmt.Errorf("prepare: buffer %q: %w", v.ScopeAndName(), err)
			}
		}
	}
	if err := comm.Broadcast(backends.BufferOf(packed), 0); err != nil {
		return fmt.Errorf("prepare: broadcasting the buffers: %w", err)
	}
	if root {
		return nil
	}
	at := 0
	for _, v := range vars {
		t, err := v.Value()
		if err == nil {
			err = t.MutableBytes(func(data []byte) { at += copy(data, packed[at:]) })
		}
		if err != nil {
			return fmt.Errorf("prepare: buffer %q: %w", v.ScopeAndName(), err)
		}
	}
	return nil
}

// averageVariables gives every rank the mean of the ranks' values of vars (floating point), summed in
// float64 in one all-reduce and rounded once into each variable's dtype: every rank gets the same sum, so
// the same mean, bit for bit.
func averageVariables(comm *backends.Communicator, vars []*context.Variable) error {
	if len(vars) == 0 {
		return nil
	}
	size := 0
	for _, v := range vars {
		size += v.Shape().Size()
	}
	sums := make([]float64, 0, size)
	for _, v := range vars {
		t, err := v.Value()
		if err == nil {
			err = t.ConstFlatData(func(flat any) { sums = appendFloat64(sums, flat) })
		}
		if err != nil {
			return fmt.Errorf("prepare: buffer %q: %w", v.ScopeAndName(), err)
		}
	}
	if err := comm.AllReduceSum(backends.BufferOf(sums)); err != nil {
		return fmt.Errorf("prepare: averaging the buffers: %w", err)
	}
	n := float64(comm.Size())
	at := 0
	for _, v := range vars {
		t, err := v.Value()
		if err == nil {
			err = t.MutableFlatData(func(flat any) { at += setMeans(flat, sums[at:], n) })
		}
		if err != nil {
			return fmt.Errorf("prepare: buffer %q: %w", v.ScopeAndName(), err)
		}
	}
	return nil
}

func appendFloat64(dst []float64, flat any) []float64 {
	switch f := flat.(type) {
	case []float32:
		for _, x := range f {
			dst = append(dst, float64(x))
		}
	case []float64:
		dst = append(dst, f...)
	case []float16.Float16:
		for _, x := range f {
			dst = append(dst, float64(x.Float32()))
		}
	case []bfloat16.BFloat16:
		for _, x := range f {
			dst = append(dst, float64(x.Float32()))
		}
	default:
		panic(fmt.Sprintf("averaging a buffer of %T", flat))
	}
	return dst
}

// setMeans writes sums[i]/n into flat, rounded to its element type, and returns how many it wrote.
func setMeans(flat any, sums []float64, n float64) int {
	switch f := flat.(type) {
	case []float32:
		for i := range f {
			f[i] = float32(sums[i] / n)
		}
		return len(f)
	case []float64:
		for i := range f {
			f[i] = sums[i] / n
		}
		return len(f)
	case []float16.Float16:
		for i := range f {
			f[i] = float16.Fromfloat32(float32(sums[i] / n))
		}
		return len(f)
	case []bfloat16.BFloat16:
		for i := range f {
			f[i] = bfloat16.FromFloat64(sums[i] / n)
		}
		return len(f)
	}
	panic(fmt.Sprintf("averaging a buffer of %T", flat))
}
