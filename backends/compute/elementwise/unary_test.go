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
