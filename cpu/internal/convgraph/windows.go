package convgraph

import (
	"slices"

	"github.com/gomlx/gomlx/pkg/core/graph"
)

// This file holds the window arithmetic shared by the convolution and pooling gradients, built only from
// ops the pure-Go backend implements: padding is a Concatenate with a filled block (simplego has no Pad),
// and zeros between strided outputs come from a Concatenate and a Reshape.

// windowGeometry describes, for each windowed axis of an operand, how a convolution or pooling reads it:
// output position o of axis i covers the input positions o*strides[i] + k*dilations[i] - lowPads[i] for
// window (kernel) positions k in [0, sizes[i]).
type windowGeometry struct {
	axes       []int // Axes of the operand (and of the output) that are windowed.
	sizes      []int // Window (kernel) size per windowed axis.
	strides    []int
	dilations  []int
	lowPads    []int // Padding before the start of each windowed axis.
	inputDims  []int // Operand dimension of each windowed axis.
	outputDims []int // Output dimension of each windowed axis.
}

// span returns how many padded input positions the windows of windowed axis i reach: from the start of the
// low padding to the last position read.
func (w windowGeometry) span(i int) int {
	return (w.outputDims[i]-1)*w.strides[i] + (w.sizes[i]-1)*w.dilations[i] + 1
}

// numPositions is the number of positions in a window.
func (w windowGeometry) numPositions() int { return product(w.sizes) }

// positions returns every window position, in row-major order over the windowed axes.
func (w windowGeometry) positions() [][]int {
	positions := make([][]int, 0, w.numPositions())
	position := make([]int, len(w.sizes))
	var walk func(level int)
	walk = func(level int) {
		if level == len(w.sizes) {
			positions = append(positions, slices.Clone(position))
			return
		}
		for k := range w.sizes[level] {
			position[level] = k
			walk(level + 1)
		}
	}
	walk(0)
	return positions
}

// positionIndex returns the index of a window position in the order of positions.
func (w windowGeometry) positionIndex(position []int) int {
	index := 0
	for i, k := range position {
		index = index*w.sizes[i] + k
	}
	return index
}

// padWindowed returns x padded (with fillValue) or cropped on each windowed axis so that index 0 is the first
// padded position (the low padding) and the axis holds the span the windows read.
func (w windowGeometry) padWindowed(x, fillValue *graph.Node) *graph.Node {
	for i, axis := range w.axes {
		x = shiftInto(x, axis, w.lowPads[i], w.span(i), fillValue)
	}
	return x
}

// windowSlice returns the values of padded (from padWindowed) that a window position reads for every output
// position: a strided Slice shaped like the output on the windowed axes.
func (w windowGeometry) windowSlice(padded *graph.Node, position []int) *graph.Node {
	specs := make([]graph.SliceAxisSpec, padded.Rank())
	for axis := range specs {
		specs[axis] = graph.AxisRange()
	}
	for i, axis := range w.axes {
		start := position[i] * w.dilations[i]
		specs[axis] = graph.AxisRange(start, start+(w.outputDims[i]-1)*w.strides[i]+1).Stride(w.strides[i])
	}
	return graph.Slice(padded, specs...)
}

// foldWindows is the col2im: it returns the sum, over every window position, of contribution(position)
// (shaped like the output on the windowed axes) moved back to the input positions that window position read,
// dropping what lands in the padding. The result is shaped like the input on the windowed axes.
//
// It folds one windowed axis at a time, last axis first, so that of the 9+3 placements of a 3×3 window
// only 3 are of input-sized tensors.
func (w windowGeometry) foldWindows(contribution func(position []int) *graph.Node) *graph.Node {
	position := make([]int, len(w.axes))
	var fold func(level int) *graph.Node
	fold = func(level int) *graph.Node {
		if level == len(w.axes) {
			return contribution(slices.Clone(position))
		}
		axis := w.axes[level]
		var sum, unplaced *graph.Node
		for k := range w.sizes[level] {
			position[level] = k
			unplaced = dilate(fold(level+1), axis, w.strides[level])
			part := shiftInto(unplaced, axis, k*w.dilations[level]-w.lowPads[level], w.inputDims[level], nil)
			switch {
			case part == nil: // This window position only reads padding on this axis.
			case sum == nil:
				sum = part
			default:
				sum = graph.Add(sum, part)
			}
		}
		if sum == nil {
			foldedShape := unplaced.Shape().Clone()
			foldedShape.Dimensions[axis] = w.inputDims[level]
			return graph.Zeros(unplaced.Graph(), foldedShape)
		}
		return sum
	}
	return fold(0)
}

// shiftInto returns a tensor like x but with length elements on axis, where element i is x's element
// i-offset, or fillValue (zero if nil) where i-offset is out of x's range. A negative offset crops the start
// of x, a too short length crops its end. It returns nil if no element of x lands in [0, length).
func shiftInto(x *graph.Node, axis, offset, length int, fillValue *graph.Node) *graph.Node {
	dim := x.Shape().Dimensions[axis]
	first := max(0, -offset)       // First element of x that is kept.
	end := min(dim, length-offset) // One past the last element of x that is kept.
	if end <= first {
		return nil
	}
	if first == 0 && end == dim && offset == 0 && length == dim {
		return x
	}
	if first > 0 || end < dim {
		x = sliceAxis(x, axis, first, end, 1)
	}
	before := offset + first
	after := length - before - (end - first)
	parts := make([]*graph.Node, 0, 3)
	if before > 0 {
		parts = append(parts, filled(x, axis, before, fillValue))
	}
	parts = append(parts, x)
	if after > 0 {
		parts = append(parts, filled(x, axis, after, fillValue))
	}
	if len(parts) == 1 {
		return x
	}
	return graph.Concatenate(parts, axis)
}

// dilate inserts stride-1 zeros after each element of x along axis, so that element o lands at o*stride.
// The trailing zeros after the last element are kept: shiftInto crops them where they do not fit.
func dilate(x *graph.Node, axis, stride int) *graph.Node {
	if stride <= 1 {
		return x
	}
	dims := x.Shape().Dimensions
	expanded := slices.Insert(slices.Clone(dims), axis+1, 1)
	x = graph.Reshape(x, expanded...)
	x = graph.Concatenate([]*graph.Node{x, filled(x, axis+1, stride-1, nil)}, axis+1)
	merged := slices.Clone(dims)
	merged[axis] *= stride
	return graph.Reshape(x, merged...)
}

// filled returns a tensor shaped like x except for size elements on axis, all fillValue (zero if nil).
func filled(x *graph.Node, axis, size int, fillValue *graph.Node) *graph.Node {
	shape := x.Shape().Clone()
	shape.Dimensions[axis] = size
	if fillValue == nil {
		return graph.Zeros(x.Graph(), shape)
	}
	return graph.BroadcastToShape(fillValue, shape)
}

// sliceAxis returns x[start:end:stride] on axis, all other axes whole.
func sliceAxis(x *graph.Node, axis, start, end, stride int) *graph.Node {
	return graph.SliceAxis(x, axis, graph.AxisRange(start, end).Stride(stride))
}

// transposeTo returns x with its axes in the given order (output axis i is x's axis order[i]), or x itself
// when that is the identity.
func transposeTo(x *graph.Node, order []int) *graph.Node {
	for i, axis := range order {
		if i != axis {
			return graph.TransposeAllAxes(x, order...)
		}
	}
	return x
}

// inversePermutation returns the order that undoes transposeTo(·, order).
func inversePermutation(order []int) []int {
	inverse := make([]int, len(order))
	for i, axis := range order {
		inverse[axis] = i
	}
	return inverse
}

// isPermutation reports whether axes holds each of 0..rank-1 exactly once.
func isPermutation(axes []int, rank int) bool {
	if len(axes) != rank {
		return false
	}
	seen := make([]bool, rank)
	for _, axis := range axes {
		if axis < 0 || axis >= rank || seen[axis] {
			return false
		}
		seen[axis] = true
	}
	return true
}

// valueOr returns values[i], or def when values is empty or values[i] is not positive (GoMLX and simplego
// read both as the default).
func valueOr(values []int, i, def int) int {
	if len(values) == 0 || values[i] <= 0 {
		return def
	}
	return values[i]
}

// product returns the product of values.
func product(values []int) int {
	p := 1
	for _, v := range values {
		p *= v
	}
	return p
}
