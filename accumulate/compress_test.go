package accumulate_test

import (
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/half"
)

func TestParseCompression(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want accumulate.Compression
	}{
		{"bf16", accumulate.BF16},
		{" BFloat16 ", accumulate.BF16},
		{"fp16", accumulate.FP16},
		{"float16", accumulate.FP16},
		{"none", accumulate.NoCompression},
		{"OFF", accumulate.NoCompression},
	} {
		got, err := accumulate.ParseCompression(tc.in)
		require.NoError(t, err, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
	for _, bad := range []string{"", "int8", "bf8", "16"} {
		_, err := accumulate.ParseCompression(bad)
		require.Error(t, err, "%q", bad)
		assert.Contains(t, err.Error(), fmt.Sprintf("%q", bad))
	}
	assert.Equal(t, "bf16", accumulate.BF16.String())
	assert.Equal(t, "Compression(9)", accumulate.Compression(9).String())
	assert.False(t, accumulate.Compression(9).Valid())
	assert.False(t, accumulate.Compression(-1).Valid())
	assert.True(t, accumulate.NoCompression.Valid())
}

func TestNewCompressionHook(t *testing.T) {
	for _, format := range []accumulate.Compression{accumulate.BF16, accumulate.FP16} {
		h, err := accumulate.NewCompressionHook(format)
		require.NoError(t, err)
		assert.Equal(t, format.String()+" compression", h.Name())
		assert.Equal(t, format, h.Format())
	}
	for _, format := range []accumulate.Compression{accumulate.NoCompression, accumulate.Compression(5)} {
		_, err := accumulate.NewCompressionHook(format)
		require.ErrorContains(t, err, format.String())
	}
}

// compressedValue is rank r's element i: values spread over several binades with bits below bfloat16's
// and fp16's precision, so that rounding really happens, signs mixed so that partial sums cancel.
func compressedValue(r, i int) float64 {
	v := (1 + float64(i%97)/97 + float64(r)/7) * math.Ldexp(1, i%9-6)
	if (i+r)%3 == 0 {
		v = -v
	}
	return v
}

// TestCompressionHookSync: with compression, a sync leaves every rank holding bit for bit the same sum,
// the one the 16-bit rules give (each rank's values rounded, then added in float32 and rounded once per
// addition, in rank order as the in-process engine adds), within N·u·Σ|g_r| of the exact sum; it is not
// the uncompressed sum; and the communicator counted half the bytes of a float32 bucket, a quarter of a
// float64 one.
func TestCompressionHookSync(t *testing.T) {
	const n = 1000
	for _, tc := range []struct {
		format accumulate.Compression
		dtype  dtypes.DType
		ranks  int
		u      float64 // the format's unit roundoff
		encode func(float64) float64
		add    func(a, b float64) float64
	}{
		{accumulate.BF16, dtypes.Float32, 2, 0x1p-8, bf16, bf16Sum},
		{accumulate.BF16, dtypes.Float32, 4, 0x1p-8, bf16, bf16Sum},
		{accumulate.BF16, dtypes.Float64, 3, 0x1p-8, bf16, bf16Sum},
		{accumulate.FP16, dtypes.Float32, 4, 0x1p-11, fp16, fp16Sum},
	} {
		t.Run(fmt.Sprintf("%s/%s/ranks=%d", tc.format, tc.dtype, tc.ranks), func(t *testing.T) {
			plan, err := accumulate.NewPlan([]accumulate.Param{param("w", tc.dtype, n)}, 0, 1<<20)
			require.NoError(t, err)
			comms, err := backends.NewInProcessGroup(tc.ranks)
			require.NoError(t, err)
			buckets := make([]*tensors.Tensor, tc.ranks)
			errs := make([]error, tc.ranks)
			var wg sync.WaitGroup
			for r := range tc.ranks {
				values := make([]float64, n)
				for i := range values {
					values[i] = compressedValue(r, i)
				}
				buckets[r] = floatTensor(tc.dtype, values)
				hook, err := accumulate.NewCompressionHook(tc.format)
				require.NoError(t, err)
				reducer := accumulate.NewReducer(comms[r], plan, accumulate.WithCommHook(hook))
				wg.Go(func() { errs[r] = reducer.Sync([]*tensors.Tensor{buckets[r]}) })
			}
			wg.Wait()
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
			got0 := asFloat64s(buckets[0])
			differs := false
			for i := range n {
				want, exact, magnitudes := tc.encode(compressedValue(0, i)), compressedValue(0, i), math.Abs(compressedValue(0, i))
				for r := 1; r < tc.ranks; r++ {
					want = tc.add(want, tc.encode(compressedValue(r, i)))
					exact += compressedValue(r, i)
					magnitudes += math.Abs(compressedValue(r, i))
				}
				require.Equal(t, want, got0[i], "element %d: the 16-bit rules' sum", i)
				require.LessOrEqual(t, math.Abs(got0[i]-exact), float64(tc.ranks)*tc.u*magnitudes, "element %d", i)
				differs = differs || got0[i] != exact
			}
			assert.True(t, differs, "the compressed sum must differ from the exact one somewhere (the hook ran)")
			for r := 1; r < tc.ranks; r++ {
				assert.Equal(t, got0, asFloat64s(buckets[r]), "rank %d holds rank 0's sum, bit for bit", r)
			}
			stats := comms[0].Stats().Of(backends.OpAllReduce)
			assert.EqualValues(t, 1, stats.Calls)
			assert.EqualValues(t, 2*n, stats.Bytes, "a 16-bit wire: 2 bytes per element, not %d", tc.dtype.Size())
			for _, c := range comms {
				require.NoError(t, c.Close())
			}
		})
	}
}

func bf16(x float64) float64       { return float64(half.BF16(float32(x)).Float32()) }
func fp16(x float64) float64       { return float64(half.FP16(float32(x)).Float32()) }
func bf16Sum(a, b float64) float64 { return bf16(float64(float32(a) + float32(b))) }
func fp16Sum(a, b float64) float64 { return fp16(float64(float32(a) + float32(b))) }

func floatTensor(dtype dtypes.DType, values []float64) *tensors.Tensor {
	if dtype == dtypes.Float64 {
		return tensors.FromValue(append([]float64(nil), values...))
	}
	f := make([]float32, len(values))
	for i, v := range values {
		f[i] = float32(v)
	}
	return tensors.FromValue(f)
}

func asFloat64s(t *tensors.Tensor) []float64 {
	var out []float64
	_ = t.ConstFlatData(func(flat any) {
		switch f := flat.(type) {
		case []float32:
			for _, v := range f {
				out = append(out, float64(v))
			}
		case []float64:
			out = append(out, f...)
		}
	})
	return out
}

// TestCompressionHookEdges: a NaN on one rank reaches every rank (a non-finite loss stops the step
// everywhere), fp16 overflows to Inf, only the part of the bucket the sharding strategy says this rank
// holds is decoded (into its block, under a strategy that splits buckets), and a bucket of integers is
// refused before any collective.
func TestCompressionHookEdges(t *testing.T) {
	plan, err := accumulate.NewPlan([]accumulate.Param{param("w", dtypes.Float32, 4)}, 0, 1<<20)
	require.NoError(t, err)
	run := func(format accumulate.Compression, sharding accumulate.Sharding, values [2][]float32) [2][]float32 {
		comms, err := backends.NewInProcessGroup(2)
		require.NoError(t, err)
		var got [2][]float32
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for r := range 2 {
			hook, err := accumulate.NewCompressionHook(format)
			require.NoError(t, err)
			bucket := tensors.FromValue(values[r])
			reducer := accumulate.NewReducer(comms[r], plan, accumulate.WithCommHook(hook), accumulate.WithSharding(sharding))
			wg.Go(func() {
				errs[r] = reducer.Sync([]*tensors.Tensor{bucket})
				got[r] = tensors.MustCopyFlatData[float32](bucket)
			})
		}
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		return got
	}
	nan := float32(math.NaN())
	got := run(accumulate.BF16, accumulate.Replicated{}, [2][]float32{{nan, 1, 2, 3}, {1, 1, 1, 1}})
	for r := range 2 {
		assert.True(t, math.IsNaN(float64(got[r][0])), "rank %d", r)
		assert.Equal(t, []float32{2, 3, 4}, got[r][1:], "rank %d", r)
	}
	got = run(accumulate.FP16, accumulate.Replicated{}, [2][]float32{{60000, 70000, 1, 0}, {10000, 0, 1, 0}})
	assert.Equal(t, []float32{float32(math.Inf(1)), float32(math.Inf(1)), 2, 0}, got[0],
		"fp16 overflows: a sum past 65504, or a value past it on one rank")
	// Under ShardOptimizer rank r receives the bf16 sum of its block of 2 (3.001 travels as 3), and the
	// bucket it sent is left as it was.
	comms, err := backends.NewInProcessGroup(2)
	require.NoError(t, err)
	sent := [2][]float32{{1, 2, 3.001, 4}, {1, 2, 3, 4}}
	var blocks [2][]float32
	var wg sync.WaitGroup
	for r := range 2 {
		hook, err := accumulate.NewCompressionHook(accumulate.BF16)
		require.NoError(t, err)
		reducer := accumulate.NewReducer(comms[r], plan, accumulate.WithCommHook(hook),
			accumulate.WithSharding(accumulate.ShardOptimizer{}))
		bucket, block := tensors.FromValue(sent[r]), tensors.FromShape(shapes.Make(dtypes.Float32, 2))
		wg.Go(func() {
			assert.NoError(t, reducer.SyncInto([]*tensors.Tensor{bucket}, []*tensors.Tensor{block}))
			blocks[r] = tensors.MustCopyFlatData[float32](block)
			assert.Equal(t, sent[r], tensors.MustCopyFlatData[float32](bucket))
		})
	}
	wg.Wait()
	assert.Equal(t, [2][]float32{{2, 4}, {6, 8}}, blocks)

	hook, err := accumulate.NewCompressionHook(accumulate.BF16)
	require.NoError(t, err)
	comm := backends.NewSingle()
	_, err = hook.Start(comm, accumulate.Replicated{}, accumulate.GradBucket{Index: 3, Buffer: backends.BufferOf([]int32{1})})
	require.ErrorContains(t, err, "bucket 3 holds int32")
	assert.Zero(t, comm.Stats().Calls(), "refused before any collective")
}
