package accumulate_test

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
)

// powerPlan is one bucket: a vector of 10 (elements 0–9: backward produces it first), then a 12×10 matrix
// (elements 10–129).
func powerPlan(t *testing.T) accumulate.Plan {
	t.Helper()
	plan, err := accumulate.NewPlan([]accumulate.Param{param("w", dtypes.Float32, 12, 10), param("b", dtypes.Float32, 10)},
		0, 1<<20)
	require.NoError(t, err)
	require.Len(t, plan.Buckets, 1)
	require.Equal(t, []accumulate.Slot{{Param: 1, Offset: 0, Size: 10}, {Param: 0, Offset: 10, Size: 120}}, plan.Buckets[0].Slots)
	return plan
}

// matrixPart and vectorPart are the bucket's matrix and vector elements.
func matrixPart(b []float32) []float32 { return b[10:] }
func vectorPart(b []float32) []float32 { return b[:10] }

// powerRanks syncs each rank's bucket values through one PowerSGD hook per rank, syncs times (the same
// values every time, error feedback carrying over), and returns every sync's result on rank 0.
func powerRanks(t *testing.T, plan accumulate.Plan, cfg accumulate.PowerSGDConfig, values [][]float32, syncs int) ([][]float32, []*accumulate.PowerSGDHook) {
	t.Helper()
	comms, err := backends.NewInProcessGroup(len(values))
	require.NoError(t, err)
	hooks := make([]*accumulate.PowerSGDHook, len(values))
	reducers := make([]*accumulate.Reducer, len(values))
	for r := range values {
		hooks[r], err = accumulate.NewPowerSGDHook(cfg)
		require.NoError(t, err)
		reducers[r] = accumulate.NewReducer(comms[r], plan, accumulate.WithCommHook(hooks[r]))
	}
	var out [][]float32
	for range syncs {
		results := make([][]float32, len(values))
		var wg sync.WaitGroup
		for r := range values {
			wg.Go(func() {
				bucket := tensors.FromValue(append([]float32(nil), values[r]...))
				assert.NoError(t, reducers[r].Sync([]*tensors.Tensor{bucket}))
				results[r] = tensors.MustCopyFlatData[float32](bucket)
			})
		}
		wg.Wait()
		for r := range values {
			require.Equal(t, results[0], results[r], "every rank gets the same approximation")
		}
		out = append(out, results[0])
	}
	return out, hooks
}

func randomValues(seed uint64, n int) []float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

func exactSum(values [][]float32) []float32 {
	sum := make([]float32, len(values[0]))
	for _, v := range values {
		for i, x := range v {
			sum[i] += x
		}
	}
	return sum
}

func maxAbsDiff(a, b []float32) float64 {
	worst := 0.0
	for i := range a {
		worst = max(worst, math.Abs(float64(a[i]-b[i])))
	}
	return worst
}

// TestPowerSGDRecoversLowRankSums: when the ranks' gradient matrices sum to a matrix of rank ≤ r, one
// compressed sync gives the exact sum (to float32 rounding): P spans its columns. The vector travels
// uncompressed, exactly.
func TestPowerSGDRecoversLowRankSums(t *testing.T) {
	plan := powerPlan(t)
	u0, u1, v := randomValues(1, 12), randomValues(2, 12), randomValues(3, 10)
	values := make([][]float32, 2)
	for r, u := range [][]float32{u0, u1} {
		values[r] = make([]float32, 130)
		for i := range 12 {
			for j := range 10 {
				values[r][10+i*10+j] = u[i] * v[j] // u_r·vᵀ: the sum (u0+u1)·vᵀ has rank 1
			}
		}
		copy(vectorPart(values[r]), randomValues(uint64(10+r), 10))
	}
	out, hooks := powerRanks(t, plan, accumulate.PowerSGDConfig{Rank: 1}, values, 1)
	sum := exactSum(values)
	assert.LessOrEqual(t, maxAbsDiff(matrixPart(out[0]), matrixPart(sum)), 1e-4, "a rank-1 sum through rank-1 PowerSGD")
	assert.Equal(t, vectorPart(sum), vectorPart(out[0]), "the vector is all-reduced as it is")
	stats := hooks[0].Stats()
	assert.EqualValues(t, 1, stats.CompressedSyncs)
	assert.EqualValues(t, 130, stats.Uncompressed)
	assert.EqualValues(t, 12+10+10, stats.Elements, "P (12×1), Q (10×1) and the vector")
	assert.InDelta(t, 130.0/32, stats.Ratio(), 1e-9)
}

// TestPowerSGDStartIterAndErrorFeedback: the first StartIter syncs are exact all-reduces; afterwards a
// full-rank sum is approximated, and with error feedback the mean of the approximations over many syncs of
// the same gradients converges to the sum (what the approximation misses is carried into the next sync),
// which without error feedback it does not.
func TestPowerSGDStartIterAndErrorFeedback(t *testing.T) {
	plan := powerPlan(t)
	values := [][]float32{randomValues(4, 130), randomValues(5, 130)}
	sum := exactSum(values)
	const start, syncs = 3, 200
	mean := func(out [][]float32) []float32 {
		m := make([]float32, 120)
		for _, o := range out[start:] {
			for i := range m {
				m[i] += matrixPart(o)[i] / float32(len(out)-start)
			}
		}
		return m
	}
	out, _ := powerRanks(t, plan, accumulate.PowerSGDConfig{Rank: 2, StartIter: start}, values, syncs)
	for s := range start {
		assert.Equal(t, sum, out[s], "sync %d is before StartIter: exact", s+1)
	}
	first := maxAbsDiff(matrixPart(out[start]), matrixPart(sum))
	assert.Greater(t, first, 0.1, "a full-rank 12×10 sum is not rank 2")
	withFeedback := maxAbsDiff(mean(out), matrixPart(sum))
	assert.Less(t, withFeedback, first/10, "error feedback: the approximations average to the sum")

	out, _ = powerRanks(t, plan, accumulate.PowerSGDConfig{Rank: 2, StartIter: start, NoErrorFeedback: true}, values, syncs)
	without := maxAbsDiff(mean(out), matrixPart(sum))
	assert.Greater(t, without, 5*withFeedback, "without error feedback the bias stays")
}

// TestPowerSGDStateRoundTrip: the state MarshalBinary saves restores a hook that then computes what the
// original computes, bit for bit; damaged bytes are refused and leave the hook as it was; ResizeState keeps
// the Qs and the count and zeroes the errors.
func TestPowerSGDStateRoundTrip(t *testing.T) {
	plan := powerPlan(t)
	values := [][]float32{randomValues(6, 130)}
	cfg := accumulate.PowerSGDConfig{Rank: 2}
	// One process makes no collective call, so a hook of one rank is driven through a group of 2 ranks
	// with the same values: rank 0's state is the one saved.
	two := [][]float32{values[0], values[0]}
	_, hooks := powerRanks(t, plan, cfg, two, 3)
	saved, err := hooks[0].MarshalBinary()
	require.NoError(t, err)

	restored, err := accumulate.NewPowerSGDHook(cfg)
	require.NoError(t, err)
	require.NoError(t, restored.UnmarshalBinary(saved))
	again, err := restored.MarshalBinary()
	require.NoError(t, err)
	assert.Equal(t, saved, again)
	assert.Equal(t, hooks[0].Stats(), restored.Stats())

	for _, bad := range [][]byte{nil, {9}, saved[:len(saved)-3], append(append([]byte(nil), saved...), 0)} {
		assert.Error(t, restored.UnmarshalBinary(bad))
	}
	after, err := restored.MarshalBinary()
	require.NoError(t, err)
	assert.Equal(t, saved, after, "a refused state leaves the hook as it was")

	resized, err := restored.ResizeState([][]byte{saved, saved}, 0, 3)
	require.NoError(t, err)
	require.NoError(t, restored.UnmarshalBinary(resized))
	assert.Equal(t, hooks[0].Stats(), restored.Stats(), "the count carries over")
	assert.NotEqual(t, saved, resized, "the errors were zeroed")
}

// TestPowerSGDRefuses: bad configurations, a strategy that splits buckets, and float64 buckets.
func TestPowerSGDRefuses(t *testing.T) {
	for _, cfg := range []accumulate.PowerSGDConfig{{Rank: -1}, {StartIter: -1}, {MinCompressionRate: 0.5}} {
		_, err := accumulate.NewPowerSGDHook(cfg)
		assert.Error(t, err, "%+v", cfg)
	}
	hook, err := accumulate.NewPowerSGDHook(accumulate.PowerSGDConfig{})
	require.NoError(t, err)
	assert.Equal(t, 1, hook.Config().Rank)
	comm := backends.NewSingle()
	_, err = hook.Start(comm, accumulate.ShardOptimizer{}, accumulate.GradBucket{Buffer: backends.BufferOf([]float32{1})})
	assert.ErrorContains(t, err, "optimizer sharding strategy")
	_, err = hook.Start(comm, accumulate.Replicated{}, accumulate.GradBucket{Index: 2, Buffer: backends.BufferOf([]float64{1})})
	assert.ErrorContains(t, err, "bucket 2 holds float64")
}

// BenchmarkPowerSGDSync times one sync of the demo's MLP-1024 first layer (a 784×1024 matrix and a vector
// of 1024) on 2 in-process ranks, plain and through rank-4 PowerSGD: in memory the wire is free, so this is
// PowerSGD's own arithmetic, which a slow link must pay for.
func BenchmarkPowerSGDSync(b *testing.B) {
	plan, err := accumulate.NewPlan([]accumulate.Param{param("w", dtypes.Float32, 784, 1024), param("b", dtypes.Float32, 1024)},
		1<<30, 1<<30)
	require.NoError(b, err)
	require.Len(b, plan.Buckets, 1)
	for _, name := range []string{"plain", "powersgd-rank4"} {
		b.Run(name, func(b *testing.B) {
			comms, err := backends.NewInProcessGroup(2)
			require.NoError(b, err)
			reducers := make([]*accumulate.Reducer, 2)
			buckets := make([]*tensors.Tensor, 2)
			for r := range 2 {
				var opts []accumulate.ReducerOption
				if name != "plain" {
					hook, err := accumulate.NewPowerSGDHook(accumulate.PowerSGDConfig{Rank: 4})
					require.NoError(b, err)
					opts = append(opts, accumulate.WithCommHook(hook))
				}
				reducers[r] = accumulate.NewReducer(comms[r], plan, opts...)
				buckets[r] = tensors.FromValue(randomValues(uint64(r), plan.Buckets[0].Size))
			}
			b.ResetTimer()
			for range b.N {
				var wg sync.WaitGroup
				for r := range 2 {
					wg.Go(func() { assert.NoError(b, reducers[r].Sync([]*tensors.Tensor{buckets[r]})) })
				}
				wg.Wait()
			}
		})
	}
}
