// Package classlabels reads class-index labels of any integer dtype, with the type switch over a tensor's
// flat data written once, here.
package classlabels

import (
	"fmt"
	"slices"

	"github.com/gomlx/gomlx/pkg/core/tensors"
)

// Int64s returns t's values as int64; t must hold integers.
func Int64s(t *tensors.Tensor) ([]int64, error) {
	var out []int64
	err := t.ConstFlatData(func(flat any) {
		switch f := flat.(type) {
		case []int64:
			out = slices.Clone(f)
		case []int32:
			out = widen(f)
		case []int16:
			out = widen(f)
		case []int8:
			out = widen(f)
		case []uint32:
			out = widen(f)
		case []uint16:
			out = widen(f)
		case []uint8:
			out = widen(f)
		}
	})
	if err == nil && out == nil && t.Shape().Size() > 0 {
		err = fmt.Errorf("class labels must be integers, got %s", t.DType())
	}
	return out, err
}

func widen[T int8 | int16 | int32 | uint8 | uint16 | uint32](x []T) []int64 {
	out := make([]int64, len(x))
	for i, v := range x {
		out[i] = int64(v)
	}
	return out
}
