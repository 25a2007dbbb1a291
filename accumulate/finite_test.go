package accumulate

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestAllFinite32 checks the vector pass against the element-by-element one, with the values that make a sum
// not finite: infinities, NaN, both infinities, and finite values whose sum overflows.
func TestAllFinite32(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	big := float32(math.MaxFloat32)
	for _, tc := range []struct {
		name   string
		values []float32
		finite bool
	}{
		{"empty", nil, true},
		{"finite", []float32{1, -2, 3.5, 0, float32(math.Copysign(0, -1))}, true},
		{"finite, the sum overflows", []float32{big, big, big, -1}, true},
		{"+Inf", []float32{1, inf, 2}, false},
		{"-Inf", []float32{1, 2, -inf}, false},
		{"both infinities", []float32{inf, -inf}, false},
		{"NaN", []float32{1, nan}, false},
		{"NaN after an overflow", append(slices.Repeat([]float32{big}, 40), nan), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.finite, allFinite32(tc.values))
			assert.Equal(t, allFinite(tc.values), allFinite32(tc.values))
		})
	}
}
