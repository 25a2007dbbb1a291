package extraops

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestChannelsLastLoopsMatchTheRowWalk: the channels-last loops of every batch-normalization part give
// the row walk's results bit for bit (the same float64 operations in the same order), in float32 and
// float64, on layouts with one feature and with many; and the vectorised float32 loops give them within
// float32 rounding, on layouts that span several segments, take several threads, or hold more features
// than a chunk.
func TestChannelsLastLoopsMatchTheRowWalk(t *testing.T) {
	t.Cleanup(func() { channelsLastLoops, vectorisedFloat32 = true, true })
	rng := rand.New(rand.NewPCG(7, 8))
	for _, l := range []bnLayout{{outer: 1, features: 1, inner: 1}, {outer: 37, features: 16, inner: 1},
		{outer: 512, features: 3, inner: 1}, {outer: 9000, features: 16, inner: 1},
		{outer: 3, features: 1500, inner: 1}, {outer: 70001, features: 3, inner: 1}} {
		size := l.outer * l.features
		parts := []struct {
			part     bnPart
			inputs   []int // lengths: size for a tensor, features for per-feature values
			outLen   int
			variance int // the input that holds variances (positive), or -1
		}{
			{bnStats, []int{size}, 2 * l.features, -1},
			{bnNormalized, []int{size, l.features, l.features, l.features, l.features}, size, 4},
			{bnGradStats, []int{size, l.features, l.features, size}, 2 * l.features, 2},
			{bnGradOperand, []int{size, l.features, l.features, l.features, size, l.features, l.features}, size, 3},
		}
		for _, p := range parts {
			in64 := make([]any, len(p.inputs))
			in32 := make([]any, len(p.inputs))
			for i, n := range p.inputs {
				a64, a32 := make([]float64, n), make([]float32, n)
				for j := range a64 {
					a64[j] = rng.NormFloat64()
					if i == p.variance {
						a64[j] = rng.Float64() + 0.1
					}
					a32[j] = float32(a64[j])
				}
				in64[i], in32[i] = a64, a32
			}
			run := func(fast, vectorised bool) ([]float64, []float32) {
				channelsLastLoops, vectorisedFloat32 = fast, vectorised
				o64, o32 := make([]float64, p.outLen), make([]float32, p.outLen)
				require.NoError(t, runBatchNorm(p.part, l, 1e-5, o64, in64))
				require.NoError(t, runBatchNorm(p.part, l, 1e-5, o32, in32))
				return o64, o32
			}
			fast64, fast32 := run(true, false)
			slow64, slow32 := run(false, false)
			assert.Equal(t, slow64, fast64, "part %d, layout %+v, float64", p.part, l)
			assert.Equal(t, slow32, fast32, "part %d, layout %+v, float32", p.part, l)
			_, vectorised := run(true, true)
			assertWithinFloat32(t, slow32, vectorised, "part %d, layout %+v, vectorised float32", p.part, l)
		}
	}
}

// assertWithinFloat32 checks that got is want within a few float32 roundings of the values' scale: the
// vectorised loops compute in float32 where the others compute in float64 and round once. The bound is
// relative to the largest magnitude in want, since a difference of two rounded values is exact only to
// the operands' own precision.
func assertWithinFloat32(t *testing.T, want, got []float32, msgAndArgs ...any) {
	t.Helper()
	require.Len(t, got, len(want))
	scale := float32(0)
	for _, v := range want {
		scale = max(scale, abs32(v))
	}
	for i := range want {
		if d := abs32(want[i] - got[i]); d > 1e-5*max(scale, 1) {
			assert.Failf(t, "beyond float32 rounding", "element %d: want %g, got %g (difference %g, scale %g)",
				i, want[i], got[i], d, scale)
			assert.Fail(t, "context", msgAndArgs...)
			return
		}
	}
}

func abs32(x float32) float32 { return max(x, -x) }

// BenchmarkBatchNormChannelsLast times each part on a ResNet stem's activations ([64, 28, 28, 16]) with the
// float64 loops and with the vectorised float32 ones, side by side.
func BenchmarkBatchNormChannelsLast(b *testing.B) {
	defer func() { vectorisedFloat32 = true }()
	l := bnLayout{outer: 64 * 28 * 28, features: 16, inner: 1}
	rng := rand.New(rand.NewPCG(1, 2))
	size := l.outer * l.features
	tensor := func() []float32 {
		v := make([]float32, size)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	feature := func() []float32 {
		v := make([]float32, l.features)
		for i := range v {
			v[i] = 0.5 + rng.Float32()
		}
		return v
	}
	x, g, out := tensor(), tensor(), make([]float32, size)
	parts := []struct {
		name string
		part bnPart
		in   []any
	}{
		{"statistics", bnStats, []any{x}},
		{"normalized", bnNormalized, []any{x, feature(), feature(), feature(), feature()}},
		{"gradient-statistics", bnGradStats, []any{x, feature(), feature(), g}},
		{"grad-operand", bnGradOperand, []any{x, feature(), feature(), feature(), g, feature(), feature()}},
	}
	for _, p := range parts {
		for _, vectorised := range []bool{false, true} {
			name := "float64-loops"
			if vectorised {
				name = "vectorised"
			}
			b.Run(p.name+"/"+name, func(b *testing.B) {
				vectorisedFloat32 = vectorised
				b.SetBytes(int64(4 * size))
				for b.Loop() {
					if err := runBatchNorm(p.part, l, 1e-5, out, p.in); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestOnePassVarianceKeepsItsDigits: the vectorised statistics take the variance as E[d²] − E[d]² with d
// the distance from the first chunk's mean; on activations far from zero with a small spread (mean 100,
// standard deviation 0.01) that keeps the variance close to the two-pass float64 one, where the plain
// E[x²] − E[x]² in float32 would lose every digit — also when the first row is an outlier (a zero border
// position, 10,000 standard deviations away), which as the shift itself would cost every digit.
func TestOnePassVarianceKeepsItsDigits(t *testing.T) {
	t.Cleanup(func() { vectorisedFloat32 = true })
	for _, tc := range []struct {
		name            string
		zeroFirstRow    bool
		varianceEpsilon float64
	}{{"spread", false, 1e-4}, {"outlying first row", true, 1e-3}} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(9, 10))
			l := bnLayout{outer: 20000, features: 8, inner: 1}
			x := make([]float32, l.outer*l.features)
			for i := range x {
				x[i] = float32(100 + 0.01*rng.NormFloat64())
			}
			if tc.zeroFirstRow {
				clear(x[:l.features])
			}
			stats := func(vectorised bool) []float32 {
				vectorisedFloat32 = vectorised
				out := make([]float32, 2*l.features)
				require.NoError(t, runBatchNorm(bnStats, l, 1e-5, out, []any{x}))
				return out
			}
			want, got := stats(false), stats(true)
			for f := range l.features {
				assert.InDelta(t, want[f], got[f], 1e-5, "mean of feature %d", f)
				assert.InEpsilon(t, want[l.features+f], got[l.features+f], tc.varianceEpsilon, "variance of feature %d", f)
			}
		})
	}
}

// TestEmptyBatchNorm: a tensor without rows or features takes the float64 loops (NaN statistics), not the
// vectorised ones.
func TestEmptyBatchNorm(t *testing.T) {
	for _, l := range []bnLayout{{outer: 0, features: 4, inner: 1}, {outer: 5, features: 0, inner: 1}} {
		out := make([]float32, 2*l.features)
		require.NoError(t, runBatchNorm(bnStats, l, 1e-5, out, []any{make([]float32, 0)}), "%+v", l)
	}
}
