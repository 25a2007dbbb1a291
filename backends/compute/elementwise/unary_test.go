package elementwise

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestExp32 bounds exp32 against Go's float64 exp over float32's whole range, special values included.
func TestExp32(t *testing.T) {
	assert.True(t, math.IsNaN(float64(exp32(float32(math.NaN())))))
	assert.Equal(t, float32(math.Inf(1)), exp32(float32(math.Inf(1))))
	assert.Equal(t, float32(0), exp32(float32(math.Inf(-1))))
	assert.Equal(t, float32(math.Inf(1)), exp32(89))
	assert.Equal(t, float32(1), exp32(0))
	worst := 0.0
	for x := float32(-104); x < 89; x += 0.000731 {
		want := math.Exp(float64(x))
		got := float64(exp32(x))
		if math.IsInf(float64(float32(want)), 1) {
			assert.True(t, math.IsInf(got, 1), "x=%g overflows float32", x)
			continue
		}
		if want < 1.2e-38 { // Subnormal results are computed exactly: compare absolutely.
			assert.InDelta(t, want, got, 1.5e-45, "x=%g", x)
			continue
		}
		worst = max(worst, math.Abs(got-want)/want)
	}
	assert.Less(t, worst, 2e-7, "relative error (float32's epsilon is 1.19e-7)")
	t.Logf("worst relative error %.3g", worst)
}

// TestErf32 bounds erf32 against Go's float64 erf.
func TestErf32(t *testing.T) {
	assert.True(t, math.IsNaN(float64(erf32(float32(math.NaN())))))
	assert.Equal(t, float32(1), erf32(float32(math.Inf(1))))
	assert.Equal(t, float32(-1), erf32(float32(math.Inf(-1))))
	assert.Equal(t, float32(0), erf32(0))
	worst := 0.0
	for x := float32(-7); x < 7; x += 0.0001 {
		worst = max(worst, math.Abs(float64(erf32(x))-math.Erf(float64(x))))
	}
	assert.Less(t, worst, 5e-7)
	t.Logf("worst absolute error %.3g", worst)
}

// BenchmarkExp32 times exps on the inputs a transformer gives it: spread values (GELU's gradient), and a
// causal softmax's shifted scores, half of them masked to float32's lowest value.
func BenchmarkExp32(b *testing.B) {
	const n = 1 << 16
	spread, masked := make([]float32, n), make([]float32, n)
	for i := range n {
		spread[i] = float32(i%2003)/100 - 10
		masked[i] = -float32(i%61) / 10
		if (i/64)%64 < i%64 { // row i/64 of a 64×64 score matrix sees positions up to its own
			masked[i] = -math.MaxFloat32
		}
	}
	out := make([]float32, n)
	for _, input := range []struct {
		name   string
		values []float32
	}{{"spread", spread}, {"causal-softmax", masked}} {
		b.Run(input.name, func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				exps(input.values, out)
			}
		})
	}
}
