package accel

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/backends"
)

// PadAcrossProcesses pads t along its first axis with value up to the largest first dimension any rank
// passes (Accelerate's pad_across_processes), so that tensors whose first dimension differs per rank can
// be gathered. The other axes and the dtype must be the same on every rank, which every rank checks first.
// It returns t itself when no padding is needed, and the first dimension of every rank's t.
func (a *Accelerator) PadAcrossProcesses(t *tensors.Tensor, value float64) (padded *tensors.Tensor, rows []int, err error) {
	if err := a.checkOpen(); err != nil {
		return nil, nil, err
	}
	if err := a.agreeOnCallDescribed("PadAcrossProcesses", unevenDescription(t)); err != nil {
		return nil, nil, fmt.Errorf("accel: pad across processes: %w", err)
	}
	if t == nil {
		return nil, nil, errors.New("accel: pad across processes: tensor is nil")
	}
	if t.Shape().Rank() == 0 {
		return nil, nil, errors.New("accel: pad across processes: a scalar has no axis to pad")
	}
	return a.pad(t, value)
}

// GatherUneven is Gather for tensors whose first dimension differs per rank (metrics of variable-length
// batches): it pads them across processes, gathers, and drops the padding, so that the result holds every
// rank's rows, ordered by rank.
func (a *Accelerator) GatherUneven(t *tensors.Tensor) (*tensors.Tensor, error) {
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	if err := a.agreeOnCallDescribed("GatherUneven", unevenDescription(t)); err != nil {
		return nil, fmt.Errorf("accel: gather uneven: %w", err)
	}
	if t == nil {
		return nil, errors.New("accel: gather uneven: tensor is nil")
	}
	if t.Shape().Rank() == 0 {
		t = reshape(t, 1)
	}
	padded, rows, err := a.pad(t, 0)
	if err != nil {
		return nil, fmt.Errorf("accel: gather uneven: %w", err)
	}
	all, err := a.gather(padded)
	if err != nil {
		return nil, err
	}
	maxRows := padded.Shape().Dimensions[0]
	s := t.Shape()
	rowBytes := int(s.Memory()) / max(s.Dimensions[0], 1)
	if s.Dimensions[0] == 0 {
		rowBytes = int(shapes.Make(s.DType, append([]int{1}, s.Dimensions[1:]...)...).Memory())
	}
	total := 0
	for _, r := range rows {
		total += r
	}
	out := tensors.FromShape(shapes.Make(s.DType, append([]int{total}, s.Dimensions[1:]...)...))
	if out.Shape().Size() == 0 {
		return out, nil
	}
	var copyErr error
	err = all.ConstBytes(func(src []byte) {
		copyErr = out.MutableBytes(func(dst []byte) {
			offset := 0
			for r, n := range rows {
				from := r * maxRows * rowBytes
				offset += copy(dst[offset:], src[from:from+n*rowBytes])
			}
		})
	})
	if err == nil {
		err = copyErr
	}
	if err != nil {
		return nil, fmt.Errorf("accel: gather uneven: %w", err)
	}
	return out, nil
}

// pad is PadAcrossProcesses once the ranks agreed on the call.
func (a *Accelerator) pad(t *tensors.Tensor, value float64) (*tensors.Tensor, []int, error) {
	s := t.Shape()
	size := a.comm.Size()
	all := make([]int64, size)
	if err := a.comm.AllGather(backends.BufferOf([]int64{int64(s.Dimensions[0])}), backends.BufferOf(all)); err != nil {
		return nil, nil, fmt.Errorf("exchanging first dimensions: %w", err)
	}
	rows := make([]int, size)
	maxRows := 0
	for r, n := range all {
		rows[r] = int(n)
		maxRows = max(maxRows, int(n))
	}
	if maxRows == s.Dimensions[0] {
		return t, rows, nil
	}
	out := tensors.FromShape(shapes.Make(s.DType, append([]int{maxRows}, s.Dimensions[1:]...)...))
	var fillErr error
	err := out.MutableFlatData(func(flat any) {
		fillErr = fill(flat, value)
	})
	if err == nil {
		err = fillErr
	}
	if err == nil && s.Size() > 0 { // an empty tensor has no bytes to copy (GoMLX refuses to expose them)
		var copyErr error
		err = t.ConstBytes(func(src []byte) { copyErr = out.MutableBytes(func(dst []byte) { copy(dst, src) }) })
		if err == nil {
			err = copyErr
		}
	}
	if err != nil {
		return nil, nil, err
	}
	return out, rows, nil
}

// fill sets every element of a flat slice to value, converted to its type.
func fill(flat any, value float64) error {
	switch f := flat.(type) {
	case []float32:
		for i := range f {
			f[i] = float32(value)
		}
	case []float64:
		for i := range f {
			f[i] = value
		}
	case []int32:
		for i := range f {
			f[i] = int32(value)
		}
	case []int64:
		for i := range f {
			f[i] = int64(value)
		}
	case []uint8:
		for i := range f {
			f[i] = uint8(value)
		}
	case []bool:
		for i := range f {
			f[i] = value != 0
		}
	default:
		if value != 0 {
			return fmt.Errorf("padding with %g: unsupported element type %T", value, flat)
		}
	}
	return nil
}

// unevenDescription describes t for the call check, its first dimension left out: it may differ.
func unevenDescription(t *tensors.Tensor) string {
	if t == nil {
		return "none"
	}
	s := t.Shape()
	dims := make([]string, 0, s.Rank())
	for i, d := range s.Dimensions {
		if i == 0 {
			dims = append(dims, "*")
			continue
		}
		dims = append(dims, fmt.Sprint(d))
	}
	return fmt.Sprintf("(%s)[%s]", s.DType, strings.Join(dims, " "))
}
