package accumulate_test

import (
	"encoding/binary"
	"math"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
)

// TestReducerSync: the buckets are summed across ranks in place, wherever they live. A bucket held only in
// a buffer of a backend whose buffers are host memory (the pure-Go backend's, where a training step leaves
// its accumulators) is reduced in that buffer: it stays on the device, with no host copy made. A host
// tensor is reduced in its host storage.
func TestReducerSync(t *testing.T) {
	backend := simplego.GetBackend()
	for _, tc := range []struct {
		name     string
		onDevice bool
	}{
		{"device buffer", true},
		{"host tensor", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const ranks = 2
			plan, err := accumulate.NewPlan([]accumulate.Param{param("w", dtypes.Float32, 3)}, 0, 1<<20)
			require.NoError(t, err)
			comms, err := backends.NewInProcessGroup(ranks)
			require.NoError(t, err)
			buckets := make([]*tensors.Tensor, ranks)
			for r := range ranks {
				buckets[r] = tensors.FromValue([]float32{1, 10, 100})
				tensors.MustMutableFlatData(buckets[r], func(flat []float32) {
					for i := range flat {
						flat[i] *= float32(r + 1)
					}
				})
				if tc.onDevice {
					require.NoError(t, buckets[r].MaterializeOnDevice(backend, false, 0))
					buckets[r].FinalizeLocal()
					require.False(t, buckets[r].IsLocal())
				}
			}
			var wg sync.WaitGroup
			errs := make([]error, ranks)
			for r := range ranks {
				wg.Go(func() { errs[r] = accumulate.NewReducer(comms[r], plan).Sync([]*tensors.Tensor{buckets[r]}) })
			}
			wg.Wait()
			for r := range ranks {
				require.NoError(t, errs[r], "rank %d", r)
				if tc.onDevice {
					assert.False(t, buckets[r].IsLocal(), "rank %d: reduced in its device buffer, no host copy", r)
					assert.True(t, buckets[r].IsOnDevice(0), "rank %d", r)
				}
				assert.Equal(t, []float32{3, 30, 300}, tensors.MustCopyFlatData[float32](buckets[r]), "rank %d", r)
				assert.NoError(t, comms[r].Close())
			}
		})
	}
}

// countingHook records the buckets it carries and carries them as the identity hook does.
type countingHook struct {
	mu      sync.Mutex
	buckets []accumulate.GradBucket
}

func (h *countingHook) Name() string { return "counting" }

func (h *countingHook) Start(comm *backends.Communicator, sharding accumulate.Sharding, b accumulate.GradBucket) (accumulate.Waiter, error) {
	h.mu.Lock()
	h.buckets = append(h.buckets, b)
	h.mu.Unlock()
	return accumulate.IdentityHook{}.Start(comm, sharding, b)
}

// TestReducerCommHook: every bucket of a sync goes through the registered hook, in plan order, with its
// layout and its host buffer; what the hook leaves in the buffer is the sync's result.
func TestReducerCommHook(t *testing.T) {
	const ranks = 2
	plan, err := accumulate.NewPlan([]accumulate.Param{param("a", dtypes.Float32, 300), param("b", dtypes.Float64, 5)}, 0, 1<<20)
	require.NoError(t, err)
	require.Len(t, plan.Buckets, 2)
	comms, err := backends.NewInProcessGroup(ranks)
	require.NoError(t, err)
	hooks := make([]*countingHook, ranks)
	buckets := make([][]*tensors.Tensor, ranks)
	var wg sync.WaitGroup
	errs := make([]error, ranks)
	for r := range ranks {
		hooks[r] = &countingHook{}
		for _, b := range plan.Buckets {
			buckets[r] = append(buckets[r], tensors.FromShape(shapes.Make(b.DType, b.Size)))
		}
		// Planned in reverse: bucket 0 holds "b", bucket 1 holds "a".
		tensors.MustMutableFlatData(buckets[r][0], func(f []float64) { f[4] = float64(10 * (r + 1)) })
		tensors.MustMutableFlatData(buckets[r][1], func(f []float32) { f[0] = float32(r + 1) })
		reducer := accumulate.NewReducer(comms[r], plan, accumulate.WithCommHook(hooks[r]))
		assert.Equal(t, "counting", reducer.CommHook().Name())
		assert.Equal(t, "replicated", reducer.Sharding().Name())
		wg.Go(func() { errs[r] = reducer.Sync(buckets[r]) })
	}
	wg.Wait()
	for r := range ranks {
		require.NoError(t, errs[r], "rank %d", r)
		require.Len(t, hooks[r].buckets, 2, "rank %d", r)
		for i, b := range hooks[r].buckets {
			assert.Equal(t, i, b.Index)
			assert.Equal(t, plan.Buckets[i].Size, b.Buffer.Len)
			assert.Equal(t, plan.Buckets[i].Bytes(), b.Buffer.Bytes)
			assert.Equal(t, plan.Buckets[i].DType, b.Layout.DType)
		}
		assert.Equal(t, float64(30), tensors.MustCopyFlatData[float64](buckets[r][0])[4])
		assert.Equal(t, float32(3), tensors.MustCopyFlatData[float32](buckets[r][1])[0])
		assert.NoError(t, comms[r].Close())
	}
}

func TestReplicatedOwnsEverything(t *testing.T) {
	for _, tc := range []struct{ n, rank, size int }{{10, 0, 1}, {10, 1, 4}, {0, 3, 4}} {
		from, to := accumulate.Replicated{}.Owned(tc.n, tc.rank, tc.size)
		assert.Equal(t, [2]int{0, tc.n}, [2]int{from, to}, "%+v", tc)
	}
}

// modelReducer builds a reducer over one float32 accumulator of n elements, for K micro-batches per step.
func modelReducer(t *testing.T, comm *backends.Communicator, k, n int) (*accumulate.Reducer, *accumulate.GradientState, *context.Variable) {
	t.Helper()
	plan, err := accumulate.NewPlan([]accumulate.Param{param("w", dtypes.Float32, n)}, 0, 1<<20)
	require.NoError(t, err)
	gs, err := accumulate.NewGradientState(k, false)
	require.NoError(t, err)
	acc := context.New().VariableWithValue("bucket_000", make([]float32, n))
	r := accumulate.NewReducer(comm, plan, accumulate.WithGradientState(gs), accumulate.WithAccumulators([]*context.Variable{acc}))
	return r, gs, acc
}

// addToAccumulator stands in for a training step: it adds values into the accumulator.
func addToAccumulator(t *testing.T, acc *context.Variable, values ...float32) {
	t.Helper()
	v, err := acc.Value()
	require.NoError(t, err)
	tensors.MustMutableFlatData(v, func(f []float32) {
		for i, x := range values {
			f[i] += x
		}
	})
}

// TestReducerLifecycle: the reducer follows the gradient state's decisions and keeps what happened between
// optimizer steps: a mid-cycle micro-batch leaves the accumulators local, the K-th syncs them with the
// averaging scale, a Backward before the step is refused, and the step's Applied starts the next cycle.
func TestReducerLifecycle(t *testing.T) {
	r, gs, acc := modelReducer(t, backends.NewSingle(), 2, 3)
	microBatch := func(values ...float32) (syncs bool) {
		require.NoError(t, gs.Accumulate(func() error {
			var err error
			syncs, err = r.BeginMicroBatch()
			require.NoError(t, err)
			addToAccumulator(t, acc, values...)
			return r.EndMicroBatch(gs.MicroBatchScale(), 1)
		}))
		return syncs
	}
	assert.False(t, microBatch(1, 2, 3))
	assert.False(t, r.Synced())
	assert.EqualValues(t, 0, r.Syncs())
	state, err := r.State()
	require.NoError(t, err)
	assert.True(t, state.Accumulating)
	assert.Len(t, state.Accumulators, 1)
	assert.Len(t, state.Accumulators[0], 12)

	assert.True(t, microBatch(1, 1, 1))
	assert.True(t, r.Synced())
	assert.EqualValues(t, 1, r.Syncs())
	assert.InDelta(t, 1.0, r.Scale(), 1e-12)
	_, err = r.State()
	require.ErrorIs(t, err, accumulate.ErrSyncedNotApplied)
	_, err = r.BeginMicroBatch()
	require.ErrorContains(t, err, "call the optimizer's Step")

	r.Applied()
	assert.False(t, r.Synced())
	_, err = r.BeginMicroBatch()
	require.NoError(t, err)
}

// TestReducerStateRestore: a reducer restored from another's State holds the same partial sums and resumes
// accumulating; a state that does not fit the plan is refused without changing anything.
func TestReducerStateRestore(t *testing.T) {
	src, gs, acc := modelReducer(t, backends.NewSingle(), 4, 3)
	require.NoError(t, gs.Accumulate(func() error {
		addToAccumulator(t, acc, 0.5, -2, 8)
		return src.EndMicroBatch(gs.MicroBatchScale(), 1)
	}))
	saved, err := src.State()
	require.NoError(t, err)

	dst, _, dstAcc := modelReducer(t, backends.NewSingle(), 4, 3)
	for _, bad := range []accumulate.ReducerState{
		{},
		{Accumulators: [][]byte{make([]byte, 8)}},
		{Accumulators: [][]byte{make([]byte, 12), make([]byte, 12)}},
	} {
		assert.Error(t, dst.CheckRestore(bad))
		assert.Error(t, dst.Restore(bad))
	}
	assert.Equal(t, []float32{0, 0, 0}, tensors.MustCopyFlatData[float32](must(dstAcc.Value())))
	require.NoError(t, dst.Restore(saved))
	assert.Equal(t, []float32{0.5, -2, 8}, tensors.MustCopyFlatData[float32](must(dstAcc.Value())))
	// The restored partial sums count as accumulated: ZeroGrad outside Accumulate clears them.
	require.NoError(t, dst.ZeroGrad())
	assert.Equal(t, []float32{0, 0, 0}, tensors.MustCopyFlatData[float32](must(dstAcc.Value())))
}

// TestReducerNonFiniteLossStopsEveryRank: a NaN loss on one rank makes the synced gradients non-finite on
// every rank, so every rank takes the same decision about the step.
func TestReducerNonFiniteLossStopsEveryRank(t *testing.T) {
	const ranks = 2
	comms, err := backends.NewInProcessGroup(ranks)
	require.NoError(t, err)
	finite := make([]bool, ranks)
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		reducer, _, acc := modelReducer(t, comms[r], 1, 2)
		wg.Go(func() {
			addToAccumulator(t, acc, 1, 2)
			loss := 1.0
			if r == 1 {
				loss = math.NaN()
			}
			if errs[r] = reducer.EndMicroBatch(1, loss); errs[r] == nil {
				finite[r], errs[r] = reducer.Finite()
			}
		})
	}
	wg.Wait()
	for r := range ranks {
		require.NoError(t, errs[r], "rank %d", r)
		assert.False(t, finite[r], "rank %d", r)
		assert.NoError(t, comms[r].Close())
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestReducerWithoutModelRefusesMicroBatches(t *testing.T) {
	plan, err := accumulate.NewPlan([]accumulate.Param{param("w", dtypes.Float32, 2)}, 0, 1<<20)
	require.NoError(t, err)
	r := accumulate.NewReducer(backends.NewSingle(), plan)
	_, err = r.BeginMicroBatch()
	assert.Error(t, err)
	assert.Error(t, r.EndMicroBatch(1, 1))
	_, err = r.State()
	assert.Error(t, err)
}

// TestRestoredSumsAreDirty: accumulators restored with sums count as holding them even when the state says no
// cycle was under way (a model that skipped the micro-batch another model of the same gradient state synced
// on), so that a micro-step adds into them rather than setting them; zeros restore clean.
func TestRestoredSumsAreDirty(t *testing.T) {
	for _, tc := range []struct {
		name  string
		saved []byte
		dirty bool
	}{
		{"zeros", make([]byte, 12), false},
		{"sums, no cycle counted", []byte{0, 0, 0, 0, 0, 0, 0x80, 0x3f, 0, 0, 0, 0}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _, _ := modelReducer(t, backends.NewSingle(), 4, 3)
			state := accumulate.ReducerState{Accumulators: [][]byte{tc.saved}}
			require.NoError(t, r.Restore(state))
			assert.Equal(t, tc.dirty, r.Dirty())
		})
	}
}

// TestSpentSumsReadAsZeros: after AppliedLeavingSums the accumulators still hold the applied sums, but every
// reader here sees zeros (State, EachAccumulator, ClearSpent), Clear (ZeroGrad after a step) does not clear
// them again, and a micro-batch that then sets the accumulators makes them hold its values.
func TestSpentSumsReadAsZeros(t *testing.T) {
	floatsOf := func(t *testing.T, acc *context.Variable) []float32 {
		v, err := acc.Value()
		require.NoError(t, err)
		return tensors.MustCopyFlatData[float32](v)
	}
	for _, tc := range []struct {
		name string
		read func(t *testing.T, r *accumulate.Reducer, acc *context.Variable) []float32
	}{
		{"State", func(t *testing.T, r *accumulate.Reducer, _ *context.Variable) []float32 {
			s, err := r.State()
			require.NoError(t, err)
			assert.False(t, s.Accumulating)
			values := make([]float32, len(s.Accumulators[0])/4)
			for i := range values {
				values[i] = math.Float32frombits(binary.LittleEndian.Uint32(s.Accumulators[0][4*i:]))
			}
			return values
		}},
		{"EachAccumulator", func(t *testing.T, r *accumulate.Reducer, _ *context.Variable) []float32 {
			var seen []float32
			require.NoError(t, r.EachAccumulator(func(f []float32) { seen = append(seen, f...) }, nil))
			return seen
		}},
		{"ClearSpent", func(t *testing.T, r *accumulate.Reducer, acc *context.Variable) []float32 {
			require.NoError(t, r.ClearSpent())
			return floatsOf(t, acc)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, gs, acc := modelReducer(t, backends.NewSingle(), 1, 3)
			require.NoError(t, gs.Accumulate(func() error {
				_, err := r.BeginMicroBatch()
				require.NoError(t, err)
				addToAccumulator(t, acc, 1, 2, 3)
				return r.EndMicroBatch(1, 1)
			}))
			require.True(t, r.ReadyToApply())
			r.AppliedLeavingSums()
			assert.False(t, r.Dirty())
			require.NoError(t, r.Clear()) // ZeroGrad after the step: nothing to clear, the sums stay spent.
			assert.Equal(t, []float32{1, 2, 3}, floatsOf(t, acc), "left for the next micro-batch to overwrite")
			assert.Equal(t, []float32{0, 0, 0}, tc.read(t, r, acc))
			assert.Equal(t, []float32{0, 0, 0}, floatsOf(t, acc), "cleared where they are")
		})
	}
	t.Run("a micro-batch that sets them", func(t *testing.T) {
		r, gs, acc := modelReducer(t, backends.NewSingle(), 1, 2)
		for _, values := range [][]float32{{1, 2}, {5, 7}} {
			require.NoError(t, gs.Accumulate(func() error {
				_, err := r.BeginMicroBatch()
				require.NoError(t, err)
				require.NoError(t, acc.SetValue(tensors.FromValue(values))) // what a fresh micro-step does
				return r.EndMicroBatch(1, 1)
			}))
			r.AppliedLeavingSums()
		}
		// The second micro-batch's values were live, not spent, until its step: a reader after a micro-batch
		// sees them.
		require.NoError(t, gs.Accumulate(func() error {
			_, err := r.BeginMicroBatch()
			require.NoError(t, err)
			require.NoError(t, acc.SetValue(tensors.FromValue([]float32{4, 8})))
			return r.EndMicroBatch(1, 1)
		}))
		var seen []float32
		require.NoError(t, r.EachAccumulator(func(f []float32) { seen = append(seen, f...) }, nil))
		assert.Equal(t, []float32{4, 8}, seen)
	})
}
