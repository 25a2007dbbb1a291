package indexing

import (
	"github.com/gomlx/gomlx/backends/simplego"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// minSliceRun is the shortest run of contiguous elements sliceRuns copies at once: below it one copy call
// per run costs more than simplego's element loop.
const minSliceRun = 8

// sliceRuns computes a Slice as copies of contiguous runs, or returns false (allocating nothing) when the
// runs would be short or the slice is not one it handles. A run is the last axes of the output that lie
// contiguous in the operand: the innermost axis taken with stride 1, extended over the axes before it while
// every axis after them is taken whole. Slicing a flat gradient bucket back into parameters (every update
// of a prepared model) is one run per parameter; simplego moves it one element at a time, stepping a
// per-axis counter for each.
func sliceRuns(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer) (*simplego.Buffer, bool) {
	outShape, ok := gomlxpatch.NodeShape(node)
	in, ok2 := shapesOf(backend, inputs)
	if !ok || !ok2 || len(in) != 1 || in[0].DType != outShape.DType || in[0].Rank() != outShape.Rank() ||
		in[0].Rank() == 0 {
		return nil, false
	}
	r, err := gomlxpatch.NewNodeDataReader(gomlxpatch.NodeData(node), "sliceNode")
	if err != nil {
		return nil, false
	}
	starts, strides := r.Ints("starts"), r.Ints("strides")
	rank := in[0].Rank()
	if r.Err != nil || len(starts) != rank || len(strides) != rank {
		return nil, false
	}
	dims, out := in[0].Dimensions, outShape.Dimensions
	// first is the outermost axis of the run: every axis after it is whole, and it is stepped by 1.
	first := rank - 1
	if strides[first] != 1 && out[first] > 1 {
		return nil, false
	}
	for first > 0 && out[first] == dims[first] && (strides[first-1] == 1 || out[first-1] <= 1) {
		first--
	}
	run := 1
	for _, d := range out[first:] {
		run *= d
	}
	size := outShape.Size()
	if size > 0 && run < minSliceRun {
		return nil, false
	}
	operand, err := backend.BufferData(inputs[0])
	if err != nil || !copyable(operand) {
		return nil, false
	}
	// steps[a] is how far the operand's flat index moves for one step of output axis a.
	steps := make([]int, rank)
	base, stride := 0, 1
	for a := rank - 1; a >= 0; a-- {
		base += starts[a] * stride
		steps[a] = stride * strides[a]
		stride *= dims[a]
	}
	output, outData, ok := newOutput(backend, outShape)
	if !ok {
		return nil, false
	}
	if size == 0 {
		return output, true
	}
	// One offset per run: an odometer over the output axes before first.
	offsets := make([]int, 0, size/run)
	index := make([]int, first)
	for offset := base; ; {
		offsets = append(offsets, offset)
		a := first - 1
		for ; a >= 0; a-- {
			index[a]++
			offset += steps[a]
			if index[a] < out[a] {
				break
			}
			offset -= index[a] * steps[a]
			index[a] = 0
		}
		if a < 0 {
			break
		}
	}
	copyRuns(outData, operand, offsets, run)
	return output, true
}

// copyRuns copies src[offsets[i]:offsets[i]+run] to dst's i-th run, for each i.
func copyRuns(dst, src any, offsets []int, run int) {
	switch d := dst.(type) {
	case []float32:
		copyRunsOf(d, src.([]float32), offsets, run)
	case []float64:
		copyRunsOf(d, src.([]float64), offsets, run)
	case []int32:
		copyRunsOf(d, src.([]int32), offsets, run)
	case []int64:
		copyRunsOf(d, src.([]int64), offsets, run)
	case []uint8:
		copyRunsOf(d, src.([]uint8), offsets, run)
	case []bool:
		copyRunsOf(d, src.([]bool), offsets, run)
	}
}

func copyRunsOf[T any](dst, src []T, offsets []int, run int) {
	for i, offset := range offsets {
		copy(dst[i*run:(i+1)*run], src[offset:offset+run])
	}
}
