package convgraph

import (
	"fmt"
	"slices"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// convGeneralGradients returns the gradients of a ConvGeneral node's input and kernel given v, the gradient
// arriving at its output. It returns false for convolutions left to GoMLX's VJP: input dilations (GoMLX
// itself only differentiates them when asked for a gradient of a gradient) and channel or batch grouping.
//
// Both gradients are computed in a canonical layout, input [batch, spatial..., inChannels], kernel
// [spatial..., inChannels, outChannels] and output [batch, spatial..., outChannels], with transposes in and
// out when the convolution's axes are laid out otherwise (channels-first, for instance):
//
//	kernel gradient[k, ci, co] = Σ_{b,o} paddedInput[b, o·stride + k·dilation, ci] · v[b, o, co]
//	input gradient[b, i, ci]   = Σ_{k,co,o : o·stride + k·dilation - lowPad = i} v[b, o, co] · kernel[k, ci, co]
//
// The first is one DotGeneral of the input's patches (im2col) with v; the second one DotGeneral of v with
// the kernel followed by foldWindows (col2im).
//
// It panics when the parameters read from the node contradict its shapes: that means GoMLX changed how it
// stores them, and falling back quietly would hide it.
func convGeneralGradients(node, v *graph.Node) ([]*graph.Node, bool) {
	inputs := node.Inputs()
	if len(inputs) != 2 {
		return nil, false
	}
	x, kernel := inputs[0], inputs[1]
	if x.DType() != node.DType() || kernel.DType() != node.DType() {
		return nil, false
	}
	params, err := readConvParams(node)
	if err != nil {
		panic(incompatible(node, err))
	}
	for i := range params.inputDilations {
		if valueOr(params.inputDilations, i, 1) != 1 {
			return nil, false
		}
	}
	if params.channelGroupCount > 1 || params.batchGroupCount > 1 {
		return nil, false
	}
	conv, err := newConvLayout(x.Shape(), kernel.Shape(), node.Shape(), params)
	if err != nil {
		panic(incompatible(node, err))
	}
	if CurrentForm() == AsConvolutions {
		inputGradient, kernelGradient := conv.gradientsAsConvolutions(x, kernel, v, params.axes)
		return []*graph.Node{inputGradient, kernelGradient}, true
	}
	return []*graph.Node{conv.inputGradient(kernel, v), conv.kernelGradient(x, v)}, true
}

// convLayout is a convolution without input dilation or grouping, in the canonical layout described at
// convGeneralGradients.
type convLayout struct {
	inputOrder, kernelOrder, outputOrder []int // Transposes from the node's layouts to the canonical ones.
	batchSize, inChannels, outChannels   int
	// windows describes the spatial axes, 1..n in the canonical input and output.
	windows windowGeometry
}

// newConvLayout checks the parameters of a ConvGeneral (without input dilation or grouping) against the
// shapes of its input x, kernel and output, and returns the canonical layout. An error means the parameters
// cannot be right.
func newConvLayout(x, kernel, output shapes.Shape, params convParams) (*convLayout, error) {
	axes := params.axes
	rank := x.Rank()
	numSpatial := rank - 2
	if kernel.Rank() != rank || output.Rank() != rank || numSpatial < 1 {
		return nil, fmt.Errorf("input %s, kernel %s and output %s must have the same rank, at least 3",
			x, kernel, output)
	}
	conv := &convLayout{
		inputOrder:  slices.Concat([]int{axes.InputBatch}, axes.InputSpatial, []int{axes.InputChannels}),
		kernelOrder: slices.Concat(axes.KernelSpatial, []int{axes.KernelInputChannels, axes.KernelOutputChannels}),
		outputOrder: slices.Concat([]int{axes.OutputBatch}, axes.OutputSpatial, []int{axes.OutputChannels}),
	}
	if !isPermutation(conv.inputOrder, rank) || !isPermutation(conv.kernelOrder, rank) ||
		!isPermutation(conv.outputOrder, rank) {
		return nil, fmt.Errorf("axes %+v do not each name every axis of rank %d once", axes, rank)
	}
	for name, values := range map[string]int{
		"strides": len(params.strides), "inputDilations": len(params.inputDilations),
		"kernelDilations": len(params.kernelDilations), "paddings": len(params.paddings),
	} {
		if values != 0 && values != numSpatial {
			return nil, fmt.Errorf("%d %s for %d spatial axes", values, name, numSpatial)
		}
	}

	xDims, kernelDims, outputDims := x.Dimensions, kernel.Dimensions, output.Dimensions
	conv.batchSize = xDims[axes.InputBatch]
	conv.inChannels = xDims[axes.InputChannels]
	conv.outChannels = kernelDims[axes.KernelOutputChannels]
	if kernelDims[axes.KernelInputChannels] != conv.inChannels || outputDims[axes.OutputChannels] != conv.outChannels ||
		outputDims[axes.OutputBatch] != conv.batchSize {
		return nil, fmt.Errorf("input %s, kernel %s and output %s disagree on batch or channels with axes %+v",
			x, kernel, output, axes)
	}

	w := &conv.windows
	for i := range numSpatial {
		padding := [2]int{}
		if len(params.paddings) > 0 {
			padding = params.paddings[i]
		}
		w.axes = append(w.axes, 1+i)
		w.sizes = append(w.sizes, kernelDims[axes.KernelSpatial[i]])
		w.strides = append(w.strides, valueOr(params.strides, i, 1))
		w.dilations = append(w.dilations, valueOr(params.kernelDilations, i, 1))
		w.lowPads = append(w.lowPads, padding[0])
		w.inputDims = append(w.inputDims, xDims[axes.InputSpatial[i]])
		w.outputDims = append(w.outputDims, outputDims[axes.OutputSpatial[i]])
		reach := w.inputDims[i] + padding[0] + padding[1] - ((w.sizes[i]-1)*w.dilations[i] + 1)
		if reach < 0 || reach/w.strides[i]+1 != w.outputDims[i] {
			return nil, fmt.Errorf("spatial axis %d: input %d, kernel %d, stride %d, dilation %d and padding %v "+
				"do not give the output's %d", i, w.inputDims[i], w.sizes[i], w.strides[i], w.dilations[i], padding,
				w.outputDims[i])
		}
	}
	return conv, nil
}

// numOutputPositions is the number of (batch, output spatial position) pairs: the rows of the im2col.
func (conv *convLayout) numOutputPositions() int {
	return conv.batchSize * product(conv.windows.outputDims)
}

// flatOutputGradient returns v in the canonical layout as a [batch·outputPositions, outChannels] matrix.
func (conv *convLayout) flatOutputGradient(v *graph.Node) *graph.Node {
	return graph.Reshape(transposeTo(v, conv.outputOrder), conv.numOutputPositions(), conv.outChannels)
}

// kernelGradient returns the gradient of the kernel: the DotGeneral of the input's patches,
// [batch·outputPositions, kernelPositions·inChannels], with the output gradient.
func (conv *convLayout) kernelGradient(x, v *graph.Node) *graph.Node {
	w := conv.windows
	padded := w.padWindowed(transposeTo(x, conv.inputOrder), nil)
	rows, numPositions := conv.numOutputPositions(), w.numPositions()
	patches := make([]*graph.Node, 0, numPositions)
	for _, position := range w.positions() {
		patches = append(patches, graph.Reshape(w.windowSlice(padded, position), rows, 1, conv.inChannels))
	}
	im2col := patches[0]
	if len(patches) > 1 {
		im2col = graph.Concatenate(patches, 1)
	}
	im2col = graph.Reshape(im2col, rows, numPositions*conv.inChannels)
	gradient := graph.DotGeneral(im2col, []int{0}, nil, conv.flatOutputGradient(v), []int{0}, nil)
	gradient = graph.Reshape(gradient, slices.Concat(w.sizes, []int{conv.inChannels, conv.outChannels})...)
	return transposeTo(gradient, inversePermutation(conv.kernelOrder))
}

// inputGradient returns the gradient of the input: v times the kernel gives, for every output position and
// kernel position, what flows back to the input position it read; foldWindows adds those up in place.
func (conv *convLayout) inputGradient(kernel, v *graph.Node) *graph.Node {
	w := conv.windows
	numPositions := w.numPositions()
	flatKernel := graph.Reshape(transposeTo(kernel, conv.kernelOrder), numPositions*conv.inChannels, conv.outChannels)
	columns := graph.DotGeneral(conv.flatOutputGradient(v), []int{1}, nil, flatKernel, []int{1}, nil)
	// columns: [batch, outputSpatial..., kernelPositions, inChannels].
	columnsDims := slices.Concat([]int{conv.batchSize}, w.outputDims, []int{numPositions, conv.inChannels})
	columns = graph.Reshape(columns, columnsDims...)
	positionAxis := len(columnsDims) - 2
	contributionDims := slices.Concat([]int{conv.batchSize}, w.outputDims, []int{conv.inChannels})
	gradient := w.foldWindows(func(position []int) *graph.Node {
		index := w.positionIndex(position)
		contribution := columns
		if numPositions > 1 {
			contribution = sliceAxis(columns, positionAxis, index, index+1, 1)
		}
		return graph.Reshape(contribution, contributionDims...)
	})
	return transposeTo(gradient, inversePermutation(conv.inputOrder))
}

// incompatible is the panic message when a node's parameters cannot be read or do not fit its shapes.
func incompatible(node *graph.Node, err error) string {
	return fmt.Sprintf("convgraph: %s node %s: %v; this GoMLX is not compatible with convgraph, call convgraph.Unregister",
		node.Type(), node, err)
}
