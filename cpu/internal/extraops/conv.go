package extraops

import (
	"fmt"
	"slices"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/shapeinference"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
)

// ConvGeneral implements backends.Builder. It passes explicit strides and kernel dilations (1s) where none
// are given: simplego's shape inference reads nil strides as 0 and rejects the convolution, and its
// grouped and dilated loop indexes nil kernel dilations. A convolution with channel or batch grouping is
// built as StableHLO defines it: the operand split into groups along its channels (its batch), the
// kernel along its output channels, one ungrouped convolution per group, concatenated along the output
// channels. simplego's own grouped loop panics, and the ungrouped ones run on the installed kernel.
func (b *extendedBuilder) ConvGeneral(input, kernel backends.Op, axes backends.ConvolveAxesConfig, strides []int,
	paddings [][2]int, inputDilations, kernelDilations []int, channelGroupCount, batchGroupCount int) (
	backends.Op, error) {
	const opType = backends.OpTypeConvGeneral
	in, err := b.shapesOf(opType, input, kernel)
	if err != nil {
		return nil, err
	}
	inputShape, kernelShape := in[0], in[1]
	spatial := inputShape.Rank() - 2
	if len(strides) == 0 && spatial > 0 {
		strides = ones(spatial)
	}
	if len(kernelDilations) == 0 && spatial > 0 {
		kernelDilations = ones(spatial)
	}
	channelGroupCount, batchGroupCount = max(channelGroupCount, 1), max(batchGroupCount, 1)
	if channelGroupCount == 1 && batchGroupCount == 1 {
		return b.Builder.ConvGeneral(input, kernel, axes, strides, paddings, inputDilations, kernelDilations, 1, 1)
	}
	// The same checks and messages as an ungrouped convolution gets from simplego.
	if _, err := shapeinference.ConvGeneralOp(inputShape, kernelShape, axes, strides, paddings, inputDilations,
		kernelDilations, channelGroupCount, batchGroupCount); err != nil {
		return nil, err
	}
	groups, inputAxis := channelGroupCount, axes.InputChannels
	if batchGroupCount > 1 {
		groups, inputAxis = batchGroupCount, axes.InputBatch
	}
	inputGroup := inputShape.Dimensions[inputAxis] / groups
	kernelGroup := kernelShape.Dimensions[axes.KernelOutputChannels] / groups
	outputs := make([]backends.Op, groups)
	for g := range groups {
		inputSlice, err := b.sliceAxis(input, inputShape.Dimensions, inputAxis, g*inputGroup, (g+1)*inputGroup)
		if err != nil {
			return nil, err
		}
		kernelSlice, err := b.sliceAxis(kernel, kernelShape.Dimensions, axes.KernelOutputChannels, g*kernelGroup,
			(g+1)*kernelGroup)
		if err != nil {
			return nil, err
		}
		outputs[g], err = b.Builder.ConvGeneral(inputSlice, kernelSlice, axes, strides, paddings, inputDilations,
			kernelDilations, 1, 1)
		if err != nil {
			return nil, err
		}
	}
	groupedConvolutions.Add(1)
	return b.Builder.Concatenate(axes.OutputChannels, outputs...)
}

// sliceAxis returns x (of dimensions dims) restricted to [from, to) on axis.
func (b *extendedBuilder) sliceAxis(x backends.Op, dims []int, axis, from, to int) (backends.Op, error) {
	starts, limits := make([]int, len(dims)), slices.Clone(dims)
	starts[axis], limits[axis] = from, to
	return b.Builder.Slice(x, starts, limits, ones(len(dims)))
}

// ReduceWindow implements backends.Builder. simplego has no reductions of booleans (layers.DropBlock's
// MinPool of its mask panics it): a Max (or) or Min (and) of booleans is computed on uint8 0s and 1s,
// converted back. Sum and Product of booleans are rejected here rather than in the middle of an execution.
func (b *extendedBuilder) ReduceWindow(x backends.Op, reductionType backends.ReduceOpType, windowDimensions, strides,
	baseDilations, windowDilations []int, paddings [][2]int) (backends.Op, error) {
	shape, err := b.OpShape(x)
	if err != nil || shape.DType != dtypes.Bool {
		return b.Builder.ReduceWindow(x, reductionType, windowDimensions, strides, baseDilations, windowDilations, paddings)
	}
	if reductionType != backends.ReduceOpMax && reductionType != backends.ReduceOpMin {
		return nil, fmt.Errorf("%s of booleans: only %s and %s are defined", backends.OpTypeReduceWindow,
			backends.ReduceOpMax, backends.ReduceOpMin)
	}
	asInts, err := b.Builder.ConvertDType(x, dtypes.Uint8)
	if err != nil {
		return nil, err
	}
	reduced, err := b.Builder.ReduceWindow(asInts, reductionType, windowDimensions, strides, baseDilations,
		windowDilations, paddings)
	if err != nil {
		return nil, err
	}
	booleanWindows.Add(1)
	return b.Builder.ConvertDType(reduced, dtypes.Bool)
}

func ones(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = 1
	}
	return s
}
