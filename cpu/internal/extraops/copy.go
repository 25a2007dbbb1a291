package extraops

import (
	"fmt"
	"reflect"
	"unsafe" // Data-moving ops copy elements as words of the element's size, whatever the dtype.

	"github.com/goaccel/goaccel/cpu/internal/broadcast"
)

// A copyPlan moves the elements of an iteration space of dimensions dims: the element at index i goes from
// src[srcBase + Σ i[a]·srcSteps[a]] to dst[dstBase + Σ i[a]·dstSteps[a]]. Pad, Reverse, DynamicSlice and
// DynamicUpdateSlice are each one such plan (steps may be negative, or skip elements).
type copyPlan struct {
	dims               []int
	srcBase, dstBase   int
	srcSteps, dstSteps []int
}

// rowMajorSteps returns the row-major strides of dims.
func rowMajorSteps(dims []int) []int {
	steps := make([]int, len(dims))
	step := 1
	for a := len(dims) - 1; a >= 0; a-- {
		steps[a] = step
		step *= dims[a]
	}
	return steps
}

// simplified drops axes of size 1 and merges each axis into the next when both sides read it contiguously
// with it, so that the innermost loop runs as long as the layout allows. A plan with an empty axis moves
// nothing and keeps it.
func (p copyPlan) simplified() copyPlan {
	q := copyPlan{srcBase: p.srcBase, dstBase: p.dstBase}
	for a, dim := range p.dims {
		if dim == 0 {
			return copyPlan{dims: []int{0}, srcSteps: []int{0}, dstSteps: []int{0}}
		}
		if dim == 1 {
			continue
		}
		last := len(q.dims) - 1
		if last >= 0 && q.srcSteps[last] == p.srcSteps[a]*dim && q.dstSteps[last] == p.dstSteps[a]*dim {
			q.dims[last] *= dim
			q.srcSteps[last], q.dstSteps[last] = p.srcSteps[a], p.dstSteps[a]
			continue
		}
		q.dims = append(q.dims, dim)
		q.srcSteps = append(q.srcSteps, p.srcSteps[a])
		q.dstSteps = append(q.dstSteps, p.dstSteps[a])
	}
	return q
}

// size is the number of elements the plan moves.
func (p copyPlan) size() int {
	n := 1
	for _, dim := range p.dims {
		n *= dim
	}
	return n
}

// runCopy moves the plan's elements from src to dst, one contiguous copy or one strided loop per row of
// the innermost axis.
func runCopy[T any](dst, src []T, p copyPlan) {
	p = p.simplified()
	if p.size() == 0 {
		return
	}
	rank := len(p.dims)
	if rank == 0 {
		dst[p.dstBase] = src[p.srcBase]
		return
	}
	inner := p.dims[rank-1]
	srcStep, dstStep := p.srcSteps[rank-1], p.dstSteps[rank-1]
	index := make([]int, rank-1)
	srcRow, dstRow := p.srcBase, p.dstBase
	for {
		if srcStep == 1 && dstStep == 1 {
			copy(dst[dstRow:dstRow+inner], src[srcRow:srcRow+inner])
		} else {
			s, d := srcRow, dstRow
			for range inner {
				dst[d] = src[s]
				s += srcStep
				d += dstStep
			}
		}
		// Next row: an odometer over the outer axes, moving both offsets along.
		a := rank - 2
		for ; a >= 0; a-- {
			index[a]++
			srcRow += p.srcSteps[a]
			dstRow += p.dstSteps[a]
			if index[a] < p.dims[a] {
				break
			}
			srcRow -= p.srcSteps[a] * p.dims[a]
			dstRow -= p.dstSteps[a] * p.dims[a]
			index[a] = 0
		}
		if a < 0 {
			return
		}
	}
}

// words is a flat buffer (a Go slice of any element type) seen as elements of the same size: its memory,
// its length in elements and the element size in bytes. The data-moving executors copy words, so that one
// instantiation per size serves every dtype.
type words struct {
	ptr  unsafe.Pointer
	len  int
	size uintptr
}

// wordsOf returns flat's memory; flat must be a slice (what simplego's Buffer holds).
func wordsOf(flat any) (words, error) {
	v := reflect.ValueOf(flat)
	if v.Kind() != reflect.Slice {
		return words{}, fmt.Errorf("extraops: buffer data is a %T, not a slice", flat)
	}
	return words{ptr: v.UnsafePointer(), len: v.Len(), size: v.Type().Elem().Size()}, nil
}

func asSlice[T any](w words) []T {
	if w.len == 0 {
		return nil
	}
	return unsafe.Slice((*T)(w.ptr), w.len)
}

// moveWords runs a copy plan between two buffers of the same element type, and first fills dst with
// element fillIndex of fillFrom when fillFrom is not nil.
func moveWords(dst, src, fillFrom any, fillIndex int, p copyPlan) error {
	d, err1 := wordsOf(dst)
	s, err2 := wordsOf(src)
	if err := errors2(err1, err2); err != nil {
		return err
	}
	var f words
	if fillFrom != nil {
		var err error
		if f, err = wordsOf(fillFrom); err != nil {
			return err
		}
		if f.size != d.size || fillIndex >= f.len {
			return fmt.Errorf("extraops: fill value of %d bytes for elements of %d", f.size, d.size)
		}
	}
	if d.size != s.size {
		return fmt.Errorf("extraops: copying elements of %d bytes into elements of %d", s.size, d.size)
	}
	switch d.size {
	case 1:
		moveTyped[uint8](d, s, f, fillIndex, p)
	case 2:
		moveTyped[uint16](d, s, f, fillIndex, p)
	case 4:
		moveTyped[uint32](d, s, f, fillIndex, p)
	case 8:
		moveTyped[uint64](d, s, f, fillIndex, p)
	case 16:
		moveTyped[[2]uint64](d, s, f, fillIndex, p)
	default:
		return fmt.Errorf("extraops: elements of %d bytes are not supported", d.size)
	}
	return nil
}

func moveTyped[T any](d, s, f words, fillIndex int, p copyPlan) {
	dst := asSlice[T](d)
	if f.ptr != nil {
		broadcast.Fill(dst, asSlice[T](f)[fillIndex])
	}
	runCopy(dst, asSlice[T](s), p)
}

// errors2 returns the first non-nil error.
func errors2(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
