package convgraph

import (
	"fmt"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// reduceWindowGradients returns the gradient of a ReduceWindow node's operand given v, the gradient arriving
// at its output: max and min pooling send each output's gradient to the first (row-major in the window)
// input position holding the pooled value, as XLA's SelectAndScatter does; sum pooling sends it to every
// position of the window (mean pooling is a sum pooling followed by a division, differentiated by GoMLX).
// Positions in the padding receive nothing.
//
// It returns false for what it leaves to GoMLX's VJP: product reductions and base or window dilations. It
// panics when the parameters read from the node contradict its shapes.
func reduceWindowGradients(node, v *graph.Node) ([]*graph.Node, bool) {
	inputs := node.Inputs()
	if len(inputs) != 1 || inputs[0].DType() != node.DType() {
		return nil, false
	}
	x := inputs[0]
	params, err := readPoolParams(node)
	if err != nil {
		panic(incompatible(node, err))
	}
	switch params.reduction {
	case backends.ReduceOpMax, backends.ReduceOpMin:
		// GoMLX's own gradient is a SelectAndScatter: one pass that picks each window's extremum and adds the
		// output gradient there. Where the backend runs it (XLA; the pure-Go backend extended by
		// convkernel), it beats the comparisons built below.
		// GoMLX's rule needs explicit strides (graph.MaxPool and MinPool pass them).
		if capabilities := node.Graph().Backend().Capabilities(); capabilities.Operations[backends.OpTypeSelectAndScatterMax] &&
			capabilities.Operations[backends.OpTypeSelectAndScatterMin] && len(params.strides) == inputs[0].Rank() {
			return nil, false
		}
	case backends.ReduceOpSum:
	default:
		return nil, false
	}
	for i := range params.baseDilations {
		if valueOr(params.baseDilations, i, 1) != 1 {
			return nil, false
		}
	}
	for i := range params.windowDilations {
		if valueOr(params.windowDilations, i, 1) != 1 {
			return nil, false
		}
	}
	windows, err := newPoolGeometry(x.Shape(), node.Shape(), params)
	if err != nil {
		panic(incompatible(node, err))
	}
	if len(windows.axes) == 0 {
		return []*graph.Node{v}, true // Windows of one element: the identity.
	}

	var fillValue *graph.Node // Padding value: the identity of the reduction, as in the forward pass.
	switch params.reduction {
	case backends.ReduceOpMax:
		fillValue = graph.Infinity(x.Graph(), x.DType(), -1)
	case backends.ReduceOpMin:
		fillValue = graph.Infinity(x.Graph(), x.DType(), 1)
	}
	if windows.isNonOverlapping() {
		return []*graph.Node{nonOverlappingPoolGradient(x, node, v, windows, fillValue)}, true
	}
	return []*graph.Node{overlappingPoolGradient(x, node, v, windows, fillValue)}, true
}

// newPoolGeometry checks a ReduceWindow's parameters (without dilations) against its operand and output
// shapes, and returns the geometry of its windowed axes: those with a window or stride above 1 or padding.
func newPoolGeometry(operand, output shapes.Shape, params poolParams) (windowGeometry, error) {
	rank := operand.Rank()
	if output.Rank() != rank || len(params.windowDimensions) != rank ||
		(len(params.strides) != 0 && len(params.strides) != rank) ||
		(len(params.paddings) != 0 && len(params.paddings) != rank) {
		return windowGeometry{}, fmt.Errorf("operand %s, output %s, window %v, strides %v and paddings %v "+
			"do not all have one value per axis", operand, output, params.windowDimensions, params.strides, params.paddings)
	}
	var w windowGeometry
	for axis := range rank {
		size := params.windowDimensions[axis]
		stride := valueOr(params.strides, axis, size) // simplego and XLA default strides to the window.
		padding := [2]int{}
		if len(params.paddings) > 0 {
			padding = params.paddings[axis]
		}
		inputDim, outputDim := operand.Dimensions[axis], output.Dimensions[axis]
		reach := inputDim + padding[0] + padding[1] - size
		if size < 1 || reach < 0 || reach/stride+1 != outputDim {
			return windowGeometry{}, fmt.Errorf("axis %d: operand %d, window %d, stride %d and padding %v "+
				"do not give the output's %d", axis, inputDim, size, stride, padding, outputDim)
		}
		if size == 1 && stride == 1 && padding == [2]int{} {
			continue
		}
		w.axes = append(w.axes, axis)
		w.sizes = append(w.sizes, size)
		w.strides = append(w.strides, stride)
		w.dilations = append(w.dilations, 1)
		w.lowPads = append(w.lowPads, padding[0])
		w.inputDims = append(w.inputDims, inputDim)
		w.outputDims = append(w.outputDims, outputDim)
	}
	return w, nil
}

// isNonOverlapping reports whether windows tile the padded input without overlap or gaps: the window equals
// the stride on every windowed axis.
func (w windowGeometry) isNonOverlapping() bool {
	for i, size := range w.sizes {
		if w.strides[i] != size || w.dilations[i] != 1 {
			return false
		}
	}
	return true
}

// nonOverlappingPoolGradient is the gradient of a pooling whose windows tile the (padded) input: reshaped to
// [..., outputDim, window, ...] on each windowed axis, the input lines up with the output broadcast over
// the window axes, so the gradient is v broadcast (sum) or v where the input holds the pooled value, first
// in the window only (max, min).
func nonOverlappingPoolGradient(x, pooled, v *graph.Node, w windowGeometry, fillValue *graph.Node) *graph.Node {
	padded := w.padWindowed(x, fillValue) // Each windowed axis now holds exactly outputDim·window elements.
	paddedDims := padded.Shape().Dimensions
	var splitDims, keptDims, windowAxes []int // keptDims: splitDims with the windows reduced to 1.
	windowed := 0
	for axis, dim := range paddedDims {
		if windowed < len(w.axes) && w.axes[windowed] == axis {
			splitDims = append(splitDims, w.outputDims[windowed], w.sizes[windowed])
			keptDims = append(keptDims, w.outputDims[windowed], 1)
			windowAxes = append(windowAxes, len(splitDims)-1)
			windowed++
			continue
		}
		splitDims = append(splitDims, dim)
		keptDims = append(keptDims, dim)
	}
	gradient := graph.BroadcastToDims(graph.Reshape(v, keptDims...), splitDims...)
	if fillValue != nil {
		windows := graph.Reshape(padded, splitDims...)
		extreme := graph.BroadcastToDims(graph.Reshape(pooled, keptDims...), splitDims...)
		gradient = graph.Where(firstInWindow(graph.Equal(windows, extreme), windowAxes), gradient,
			graph.ScalarZero(x.Graph(), x.DType()))
	}
	gradient = graph.Reshape(gradient, paddedDims...)
	return unpad(gradient, w)
}

// firstInWindow keeps, of the true values of mask, only the first of each window in row-major order over
// windowAxes (the axes of size window that the reshape of nonOverlappingPoolGradient split out).
func firstInWindow(mask *graph.Node, windowAxes []int) *graph.Node {
	g := mask.Graph()
	dims := mask.Shape().Dimensions
	// positionShape is 1 everywhere but on the window axes, where Iota numbers the window positions.
	positionShape := shapes.Make(dtypes.Int32)
	positionShape.Dimensions = make([]int, len(dims))
	for axis := range positionShape.Dimensions {
		positionShape.Dimensions[axis] = 1
	}
	for _, axis := range windowAxes {
		positionShape.Dimensions[axis] = dims[axis]
	}
	var position *graph.Node
	for _, axis := range windowAxes {
		axisPosition := graph.Iota(g, positionShape, axis)
		if position == nil {
			position = axisPosition
		} else {
			position = graph.Add(graph.MulScalar(position, float64(dims[axis])), axisPosition)
		}
	}
	position = graph.BroadcastToDims(position, dims...)
	numPositions := graph.Scalar(g, dtypes.Int32, positionShape.Size())
	first := graph.ReduceAndKeep(graph.Where(mask, position, numPositions), graph.ReduceMin, windowAxes...)
	return graph.Equal(position, graph.BroadcastToDims(first, dims...))
}

// overlappingPoolGradient is the gradient of a pooling with any windows and strides: each window position
// reads one strided Slice of the padded input shaped like the output; its share of v (all of it for sum
// pooling, where it holds the pooled value first for max and min) is added back where it read by
// foldWindows.
func overlappingPoolGradient(x, pooled, v *graph.Node, w windowGeometry, fillValue *graph.Node) *graph.Node {
	positions := w.positions()
	shares := make([]*graph.Node, len(positions))
	if fillValue == nil {
		for i := range shares {
			shares[i] = v
		}
	} else {
		padded := w.padWindowed(x, fillValue)
		zero := graph.ScalarZero(x.Graph(), x.DType())
		var taken *graph.Node // Outputs whose gradient an earlier window position already took.
		for i, position := range positions {
			holds := graph.Equal(w.windowSlice(padded, position), pooled)
			selected := holds
			if taken == nil {
				taken = holds
			} else {
				selected = graph.LogicalAnd(holds, graph.LogicalNot(taken))
				taken = graph.LogicalOr(taken, holds)
			}
			shares[i] = graph.Where(selected, v, zero)
		}
	}
	return w.foldWindows(func(position []int) *graph.Node { return shares[w.positionIndex(position)] })
}

// unpad drops the low padding of each windowed axis of x (laid out as padWindowed leaves it) and restores the
// input length, with zeros where padWindowed cropped positions no window read.
func unpad(x *graph.Node, w windowGeometry) *graph.Node {
	for i, axis := range w.axes {
		shifted := shiftInto(x, axis, -w.lowPads[i], w.inputDims[i], nil)
		if shifted == nil { // Every window read padding only: nothing reaches the input.
			shape := x.Shape().Clone()
			shape.Dimensions[axis] = w.inputDims[i]
			shifted = graph.Zeros(x.Graph(), shape)
		}
		x = shifted
	}
	return x
}
