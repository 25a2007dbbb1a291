package broadcast

import (
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOf(t *testing.T) {
	tests := []struct {
		name          string
		small, output []int
		want          Pattern
		ok            bool
	}{
		{"channels-last bias", []int{1, 1, 1, 16}, []int{8, 5, 5, 16}, Pattern{200, 16, 1}, true},
		{"per-row scale", []int{37, 1}, []int{37, 129}, Pattern{1, 37, 129}, true},
		{"channels-first bias", []int{1, 7, 1, 1}, []int{3, 7, 9, 11}, Pattern{3, 7, 99}, true},
		{"a single value", []int{1, 1}, []int{4, 5}, Pattern{1, 1, 20}, true},
		{"the same shape", []int{4, 5}, []int{4, 5}, Pattern{1, 20, 1}, true},
		{"a hole", []int{3, 1, 5}, []int{3, 4, 5}, Pattern{}, false},
		{"another size", []int{2, 5}, []int{4, 5}, Pattern{}, false},
		{"another rank", []int{5}, []int{4, 5}, Pattern{}, false},
	}
	for _, tt := range tests {
		got, ok := Of(tt.small, tt.output)
		assert.Equal(t, tt.ok, ok, tt.name)
		assert.Equal(t, tt.want, got, tt.name)
	}
}

// TestExpand checks Expand against Index for every window of an output, both kinds of pattern.
func TestExpand(t *testing.T) {
	// Repeats of the small operand many times over (a bias under a tile) copy it after itself, doubling.
	for _, p := range []Pattern{{3, 4, 1}, {2, 3, 5}, {1, 1, 7}, {4, 2, 3}, {2, 3, 19}, {12, 16, 1}, {20, 7, 1}} {
		small := make([]int, p.Within)
		for i := range small {
			small[i] = 100 + i
		}
		small32 := make([]float32, len(small))
		for i, v := range small {
			small32[i] = float32(v)
		}
		size := p.Before * p.Within * p.After
		for from := range size {
			for n := 0; from+n <= size; n++ {
				got, got32 := make([]int, n), make([]float32, n) // float32 fills with vec32
				Expand(p, got, small, from)
				Expand(p, got32, small32, from)
				for i, v := range got {
					if !assert.Equal(t, small[p.Index(from+i)], v, "pattern %+v from %d element %d", p, from, i) ||
						!assert.Equal(t, float32(v), got32[i], "float32: pattern %+v from %d element %d", p, from, i) {
						return
					}
				}
			}
		}
	}
}

// TestFill: every element takes the value, whatever the element type and length, with the zero of each type
// (cleared memory) told apart from a negative zero, whose sign bit must be written.
func TestFill(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	for _, n := range []int{0, 1, 2, 3, 17, 1000} {
		for _, v := range []float32{0, negZero, 1.5, float32(math.NaN())} {
			dst := make([]float32, n)
			for i := range dst {
				dst[i] = 7
			}
			Fill(dst, v)
			for i, x := range dst {
				require.Equal(t, math.Float32bits(v), math.Float32bits(x), "float32 %v, n=%d, element %d", v, n, i)
			}
		}
		for _, v := range []int64{0, -3} {
			dst := make([]int64, n)
			for i := range dst {
				dst[i] = 9
			}
			Fill(dst, v)
			assert.Equal(t, slices.Repeat([]int64{v}, n), dst, "int64 %d, n=%d", v, n)
		}
		for _, v := range []bool{false, true} {
			dst := make([]bool, n)
			for i := range dst {
				dst[i] = !v
			}
			Fill(dst, v)
			assert.Equal(t, slices.Repeat([]bool{v}, n), dst, "bool %v, n=%d", v, n)
		}
	}
}
