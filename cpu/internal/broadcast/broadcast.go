// Package broadcast recognises the broadcasts that element-wise loops can run without materialising
// them: an operand whose axes of size > 1 form one contiguous run of the output's axes.
package broadcast

import (
	"unsafe" // Fill tells a value of all-zero bits from its bytes, whatever the element type.

	"github.com/goaccel/goaccel/internal/vec32"
)

// Pattern is how a small operand spans a contiguous run of the output's axes (size 1 elsewhere): with the
// output's elements indexed as (p, m, q) over the axes before, within and after that run, output element
// (p, m, q) pairs with the small operand's element m. A channels-last bias has After = 1 (the small operand
// repeats whole), a per-example scale Before = 1, a channels-first bias all three.
type Pattern struct {
	Before, Within, After int
}

// Of returns the pattern of small (dimensions) against output (dimensions of the same rank); ok is false
// when small is not a broadcast of that form (a dimension neither 1 nor the output's, or a hole: a
// dimension of 1 between two that are not).
func Of(small, output []int) (pattern Pattern, ok bool) {
	if len(small) != len(output) {
		return pattern, false
	}
	first, last := -1, -1 // The small operand's first and last axes of size > 1.
	for axis, dim := range small {
		switch dim {
		case output[axis]:
			if dim > 1 {
				if first < 0 {
					first = axis
				}
				last = axis
			}
		case 1:
		default:
			return pattern, false
		}
	}
	if first < 0 {
		// A single value: the whole output is one run of it.
		return Pattern{Before: 1, Within: 1, After: Product(output)}, true
	}
	for axis := first; axis <= last; axis++ {
		if small[axis] != output[axis] {
			return pattern, false // A hole: the small operand does not span a contiguous run.
		}
	}
	return Pattern{Before: Product(output[:first]), Within: Product(output[first : last+1]),
		After: Product(output[last+1:])}, true
}

// Index is the small operand's element that output element i pairs with.
func (p Pattern) Index(i int) int { return (i / p.After) % p.Within }

// Expand writes into dst the small operand's values for output elements [from, from+len(dst)).
func Expand[T any](p Pattern, dst []T, small []T, from int) {
	small = small[:p.Within]
	if p.After == 1 {
		// The small operand repeats whole: one period from the phase of from, then the filled part copied
		// after itself (a whole number of periods), doubling: a few copies per call instead of one per
		// period (a bias of 16 channels repeats 32 times in a fused program's tile).
		m := from % p.Within
		filled := copy(dst, small[m:])
		filled += copy(dst[filled:], small[:m])
		for filled < len(dst) {
			filled += copy(dst[filled:], dst[:filled])
		}
		return
	}
	// Each small element spans After consecutive output elements: fill runs.
	for len(dst) > 0 {
		n := min(len(dst), p.After-from%p.After)
		Fill(dst[:n], small[(from/p.After)%p.Within])
		dst, from = dst[n:], from+n
	}
}

// Fill sets every element of dst to v: memory clearing when v's bits are all zero (+0, false, the zeros a
// gradient scatters into), vector stores for other float32 values, doubling copies otherwise. A loop that
// stores one element at a time wrote a zeroed 8 MB gradient at a quarter of these speeds.
func Fill[T any](dst []T, v T) {
	if len(dst) < 16 {
		// Short runs (a broadcast's inner run can be a few elements): the loop costs less than choosing.
		for i := range dst {
			dst[i] = v
		}
		return
	}
	if allZeroBits(&v) {
		clear(dst)
		return
	}
	if f, ok := any(dst).([]float32); ok {
		vec32.Fill(f, any(v).(float32))
		return
	}
	dst[0] = v
	for done := 1; done < len(dst); done *= 2 {
		copy(dst[done:], dst[:done])
	}
}

// allZeroBits reports whether every byte of *v is zero (so -0.0 is not: its sign bit is set).
func allZeroBits[T any](v *T) bool {
	for _, b := range unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v)) {
		if b != 0 {
			return false
		}
	}
	return true
}

// Product is the number of elements of dims.
func Product(dims []int) int {
	p := 1
	for _, d := range dims {
		p *= d
	}
	return p
}
