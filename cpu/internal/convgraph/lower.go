package convgraph

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// LowerConvolutions returns a backend that is inner except that it builds convolutions and poolings from ops
// the pure-Go backend runs fast: a convolution as im2col plus one DotGeneral, and a pooling whose windows
// tile its input (window equal to stride, the default of graph.MaxPool and graph.MeanPool) as a Reshape
// plus one reduction. The pure-Go backend's own ConvGeneral and ReduceWindow are direct loops that iterate
// (and allocate) per output element: on a two-convolution Fashion-MNIST CNN at batch 64 (see
// BenchmarkCNNInference) the forward pass runs about 9 times faster lowered. On XLA this would only undo
// XLA's own kernels, so it is meant for the pure-Go backend.
//
// The graph still records ConvGeneral and ReduceWindow nodes (only the backend ops under them change), so
// gradients are those of graph.VJPRegistration: with Register, this package's, themselves DotGenerals,
// Slices and Reshapes. What is not lowered keeps inner's op: convolutions with input dilations, channel or
// batch grouping, poolings with overlapping windows, gaps or dilations, product pooling, non-float dtypes.
//
// Tensors are bound to the backend they were used with: use the returned backend, not inner, for the
// whole computation.
func LowerConvolutions(inner backends.Backend) backends.Backend {
	return &loweringBackend{Backend: inner}
}

// loweringBackend is a pointer type so that backends compare (tensors check which backend holds them) by
// identity.
type loweringBackend struct{ backends.Backend }

// Builder returns inner's builder, with ConvGeneral and ReduceWindow lowered.
func (b *loweringBackend) Builder(name string) backends.Builder {
	return &loweringBuilder{Builder: b.Backend.Builder(name)}
}

type loweringBuilder struct{ backends.Builder }

// ConvGeneral implements backends.Builder: as im2col plus DotGeneral where supported, else inner's ConvGeneral.
func (b *loweringBuilder) ConvGeneral(input, kernel backends.Op, axes backends.ConvolveAxesConfig,
	strides []int, paddings [][2]int, inputDilations, kernelDilations []int,
	channelGroupCount, batchGroupCount int) (backends.Op, error) {
	// simplego (v0.26.0) reads nil strides as 0, failing, and its convolution with dilations or grouping
	// indexes the kernel dilations even when nil, crashing: pass 1s instead of nil, which means the same.
	numSpatial := len(axes.InputSpatial)
	strides, kernelDilations = onesIfEmpty(strides, numSpatial), onesIfEmpty(kernelDilations, numSpatial)
	// inner's ConvGeneral also validates the parameters and infers the output shape, which im2col relies on.
	// When im2col replaces it, it costs nothing at run time: an op nobody uses is not executed.
	output, err := b.Builder.ConvGeneral(input, kernel, axes, strides, paddings, inputDilations, kernelDilations,
		channelGroupCount, batchGroupCount)
	if err != nil {
		return nil, err
	}
	if channelGroupCount > 1 || batchGroupCount > 1 || slices.ContainsFunc(inputDilations, func(d int) bool { return d > 1 }) {
		return output, nil
	}
	ops := opsOf{builder: b.Builder}
	inputShape, kernelShape, outputShape := ops.shape(input), ops.shape(kernel), ops.shape(output)
	if ops.err != nil {
		return nil, ops.err
	}
	if !inputShape.DType.IsFloat() {
		return output, nil
	}
	params := convParams{axes: axes, strides: strides, paddings: paddings, kernelDilations: kernelDilations}
	conv, err := newConvLayout(inputShape, kernelShape, outputShape, params)
	if err != nil {
		return nil, fmt.Errorf("convgraph: lowering ConvGeneral to im2col: %w", err)
	}
	lowered := conv.im2colConvolution(&ops, input, kernel, inputShape.DType)
	if ops.err != nil {
		return nil, fmt.Errorf("convgraph: lowering ConvGeneral to im2col: %w", ops.err)
	}
	return lowered, nil
}

// im2colConvolution builds, with ops, the convolution of input by kernel as the DotGeneral of the input's
// patches, [batch·outputPositions, kernelPositions·inChannels], with the kernel,
// [kernelPositions·inChannels, outChannels]: the same patches kernelGradient multiplies by the output
// gradient.
func (conv *convLayout) im2colConvolution(ops *opsOf, input, kernel backends.Op, dtype dtypes.DType) backends.Op {
	w := conv.windows
	padded := ops.transpose(input, conv.inputOrder)
	for i, axis := range w.axes {
		padded = ops.shiftInto(padded, axis, w.lowPads[i], w.span(i), dtype, nil)
	}
	rows, numPositions := conv.numOutputPositions(), w.numPositions()
	patches := make([]backends.Op, 0, numPositions)
	for _, position := range w.positions() {
		paddedDims := ops.shape(padded).Dimensions
		starts, limits, strides := make([]int, len(paddedDims)), slices.Clone(paddedDims), make([]int, len(paddedDims))
		for axis := range strides {
			strides[axis] = 1
		}
		for i, axis := range w.axes {
			starts[axis] = position[i] * w.dilations[i]
			limits[axis] = starts[axis] + (w.outputDims[i]-1)*w.strides[i] + 1
			strides[axis] = w.strides[i]
		}
		patches = append(patches, ops.reshape(ops.slice(padded, starts, limits, strides), rows, 1, conv.inChannels))
	}
	im2col := patches[0]
	if len(patches) > 1 {
		im2col = ops.concatenate(1, patches...)
	}
	im2col = ops.reshape(im2col, rows, numPositions*conv.inChannels)
	flatKernel := ops.reshape(ops.transpose(kernel, conv.kernelOrder), numPositions*conv.inChannels, conv.outChannels)
	output := ops.dotGeneral(im2col, []int{1}, flatKernel, []int{0}) // [rows, outChannels]
	output = ops.reshape(output, slices.Concat([]int{conv.batchSize}, w.outputDims, []int{conv.outChannels})...)
	return ops.transpose(output, inversePermutation(conv.outputOrder))
}

// ReduceWindow implements backends.Builder: a max, min or sum pooling whose windows tile the (padded) input
// becomes a Reshape into [..., outputDim, window, ...] on each windowed axis and one reduction of the window
// axes; any other keeps inner's ReduceWindow.
func (b *loweringBuilder) ReduceWindow(x backends.Op, reduction backends.ReduceOpType,
	windowDimensions, strides, baseDilations, windowDilations []int, paddings [][2]int) (backends.Op, error) {
	// inner's ReduceWindow also validates the parameters and infers the output shape; when the lowering
	// replaces it, it is not executed.
	output, err := b.Builder.ReduceWindow(x, reduction, windowDimensions, strides, baseDilations, windowDilations, paddings)
	if err != nil {
		return nil, err
	}
	isDilated := func(d int) bool { return d > 1 }
	if slices.ContainsFunc(baseDilations, isDilated) || slices.ContainsFunc(windowDilations, isDilated) {
		return output, nil
	}
	ops := opsOf{builder: b.Builder}
	xShape, outputShape := ops.shape(x), ops.shape(output)
	if ops.err != nil {
		return nil, ops.err
	}
	dtype := xShape.DType
	var fillValue any // The identity of the reduction, as the padding value.
	var reduce func(x backends.Op, axes ...int) (backends.Op, error)
	switch reduction {
	case backends.ReduceOpMax:
		fillValue, reduce = dtype.LowestValue(), b.Builder.ReduceMax
	case backends.ReduceOpMin:
		fillValue, reduce = dtype.HighestValue(), b.Builder.ReduceMin
	case backends.ReduceOpSum:
		reduce = b.Builder.ReduceSum
	default:
		return output, nil
	}
	if !dtype.IsFloat() {
		return output, nil
	}
	w, err := newPoolGeometry(xShape, outputShape, poolParams{reduction: reduction, windowDimensions: windowDimensions,
		strides: strides, paddings: paddings})
	if err != nil {
		return nil, fmt.Errorf("convgraph: lowering ReduceWindow: %w", err)
	}
	if len(w.axes) == 0 || !w.isNonOverlapping() {
		return output, nil
	}
	padded := x
	for i, axis := range w.axes {
		padded = ops.shiftInto(padded, axis, w.lowPads[i], w.span(i), dtype, fillValue)
	}
	var splitDims, windowAxes []int
	windowed := 0
	for axis, dim := range xShape.Dimensions {
		if windowed < len(w.axes) && w.axes[windowed] == axis {
			splitDims = append(splitDims, w.outputDims[windowed], w.sizes[windowed])
			windowAxes = append(windowAxes, len(splitDims)-1)
			windowed++
			continue
		}
		splitDims = append(splitDims, dim)
	}
	split := ops.reshape(padded, splitDims...)
	lowered := ops.do(func() (backends.Op, error) { return reduce(split, windowAxes...) })
	if ops.err != nil {
		return nil, fmt.Errorf("convgraph: lowering ReduceWindow: %w", ops.err)
	}
	return lowered, nil
}

// onesIfEmpty returns values, or n 1s if values is empty.
func onesIfEmpty(values []int, n int) []int {
	if len(values) > 0 {
		return values
	}
	ones := make([]int, n)
	for i := range ones {
		ones[i] = 1
	}
	return ones
}

// opsOf builds backend ops on a builder, keeping the first error in err: after one, every method returns
// nil without building.
type opsOf struct {
	builder backends.Builder
	err     error
}

func (o *opsOf) do(build func() (backends.Op, error)) backends.Op {
	if o.err != nil {
		return nil
	}
	op, err := build()
	if err != nil {
		o.err = err
		return nil
	}
	return op
}

func (o *opsOf) shape(x backends.Op) shapes.Shape {
	if o.err != nil {
		return shapes.Shape{}
	}
	shape, err := o.builder.OpShape(x)
	if err != nil {
		o.err = err
	}
	return shape
}

func (o *opsOf) transpose(x backends.Op, order []int) backends.Op {
	for i, axis := range order {
		if i != axis {
			return o.do(func() (backends.Op, error) { return o.builder.Transpose(x, order...) })
		}
	}
	return x
}

func (o *opsOf) reshape(x backends.Op, dims ...int) backends.Op {
	return o.do(func() (backends.Op, error) { return o.builder.Reshape(x, dims...) })
}

func (o *opsOf) slice(x backends.Op, starts, limits, strides []int) backends.Op {
	return o.do(func() (backends.Op, error) { return o.builder.Slice(x, starts, limits, strides) })
}

func (o *opsOf) concatenate(axis int, parts ...backends.Op) backends.Op {
	return o.do(func() (backends.Op, error) { return o.builder.Concatenate(axis, parts...) })
}

func (o *opsOf) dotGeneral(lhs backends.Op, lhsContracting []int, rhs backends.Op, rhsContracting []int) backends.Op {
	return o.do(func() (backends.Op, error) {
		return o.builder.DotGeneral(lhs, lhsContracting, nil, rhs, rhsContracting, nil)
	})
}

// filled returns a tensor of the given dtype and dimensions holding value (a Go value of the dtype; nil
// for zero): a scalar constant broadcast.
func (o *opsOf) filled(dtype dtypes.DType, dims []int, value any) backends.Op {
	flat := reflect.MakeSlice(reflect.SliceOf(dtype.GoType()), 1, 1)
	if value != nil {
		flat.Index(0).Set(reflect.ValueOf(value))
	}
	scalar := o.do(func() (backends.Op, error) { return o.builder.Constant(flat.Interface()) })
	return o.do(func() (backends.Op, error) { return o.builder.BroadcastInDim(scalar, shapes.Make(dtype, dims...), nil) })
}

// shiftInto is the builder-level twin of the graph-level shiftInto, filling with fillValue (nil for zero);
// here x always keeps at least one element (the windows read the input).
func (o *opsOf) shiftInto(x backends.Op, axis, offset, length int, dtype dtypes.DType, fillValue any) backends.Op {
	dims := o.shape(x).Dimensions
	if o.err != nil {
		return nil
	}
	dim := dims[axis]
	first, end := max(0, -offset), min(dim, length-offset)
	if end <= first {
		o.err = fmt.Errorf("axis %d of %v shifted by %d into %d keeps nothing", axis, dims, offset, length)
		return nil
	}
	if first > 0 || end < dim {
		starts, limits, strides := make([]int, len(dims)), slices.Clone(dims), make([]int, len(dims))
		for a := range strides {
			strides[a] = 1
		}
		starts[axis], limits[axis] = first, end
		x = o.slice(x, starts, limits, strides)
		dims = slices.Clone(dims)
		dims[axis] = end - first
	}
	before := offset + first
	after := length - before - (end - first)
	parts := make([]backends.Op, 0, 3)
	blockDims := slices.Clone(dims)
	if before > 0 {
		blockDims[axis] = before
		parts = append(parts, o.filled(dtype, blockDims, fillValue))
	}
	parts = append(parts, x)
	if after > 0 {
		blockDims[axis] = after
		parts = append(parts, o.filled(dtype, blockDims, fillValue))
	}
	if len(parts) == 1 {
		return x
	}
	return o.concatenate(axis, parts...)
}
