package convgraph

import (
	"slices"
	"sync/atomic"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/graph"
)

// Form says how this package builds the gradients of a convolution.
type Form int32

const (
	// AsConvolutions (the default) builds both gradients as one ConvGeneral each: the kernel gradient
	// convolves the input with the output gradient (batch and channels swapping roles), the input gradient
	// convolves the output gradient, dilated by the strides, with the spatially reversed kernel. A backend
	// with a fast convolution (XLA, or the pure-Go backend with convkernel installed) runs them at gemm
	// speed.
	AsConvolutions Form = iota
	// AsSlices builds them from Slice, Concatenate and DotGeneral only (im2col and col2im in the graph), for
	// a pure-Go backend whose ConvGeneral is simplego's own per-element loop.
	AsSlices
)

var currentForm atomic.Int32

// SetForm chooses how gradients built from now on compute convolutions' gradients.
func SetForm(form Form) { currentForm.Store(int32(form)) }

// CurrentForm returns the form SetForm chose last (AsConvolutions by default).
func CurrentForm() Form { return Form(currentForm.Load()) }

// gradientsAsConvolutions returns the gradients of x and kernel for the convolution conv describes, given
// v, the gradient arriving at its output, as ConvGenerals in the node's own layouts (no transposes).
//
// Per spatial axis, with input size H, kernel size K, stride s, kernel dilation d, low padding p and output
// size O (forward: out[o] = Σ_k in[o·s + k·d − p]·w[k]):
//
//	kernel gradient[k] = Σ_o in[k·d + o·s − p]·v[o]          a convolution of in by v: stride d, kernel
//	                                                          dilation s, low padding p, K outputs
//	input gradient[i]  = Σ_k' v_s[i + k'·d − ((K−1)·d − p)]·w[K−1−k']
//	                                                          a convolution of v, dilated by s (v_s), by the
//	                                                          reversed kernel: low padding (K−1)·d − p, H outputs
//
// Paddings that would be negative are clamped at zero and the surplus output positions sliced off, so the
// ConvGenerals stay within what every backend accepts.
func (conv *convLayout) gradientsAsConvolutions(x, kernel, v *graph.Node, axes backends.ConvolveAxesConfig) (
	inputGradient, kernelGradient *graph.Node) {
	w := conv.windows
	numSpatial := len(w.sizes)
	ones := make([]int, numSpatial)
	for i := range ones {
		ones[i] = 1
	}

	// Kernel gradient: x's channels act as the batch and its batch as the channels; v is the kernel, its
	// batch contracted with x's; the result comes out in the kernel's layout.
	kernelAxes := backends.ConvolveAxesConfig{
		InputBatch: axes.InputChannels, InputChannels: axes.InputBatch, InputSpatial: axes.InputSpatial,
		KernelInputChannels: axes.OutputBatch, KernelOutputChannels: axes.OutputChannels, KernelSpatial: axes.OutputSpatial,
		OutputBatch: axes.KernelInputChannels, OutputChannels: axes.KernelOutputChannels, OutputSpatial: axes.KernelSpatial,
	}
	kernelPads := make([][2]int, numSpatial)
	for i := range numSpatial {
		high := (w.sizes[i]-1)*w.dilations[i] + (w.outputDims[i]-1)*w.strides[i] + 1 - w.lowPads[i] - w.inputDims[i]
		kernelPads[i] = [2]int{w.lowPads[i], max(0, high)}
	}
	kernelGradient = graph.ConvGeneral(x, v, kernelAxes, w.dilations, kernelPads, nil, w.strides, 1, 1)
	for i, axis := range axes.KernelSpatial {
		if kernelGradient.Shape().Dimensions[axis] != w.sizes[i] {
			kernelGradient = sliceAxis(kernelGradient, axis, 0, w.sizes[i], 1)
		}
	}

	// Input gradient: v convolved with the reversed kernel, whose input and output channels swap roles.
	reversed := kernel
	for i, axis := range axes.KernelSpatial {
		reversed = reverseAxis(reversed, axis, w.sizes[i])
	}
	inputAxes := backends.ConvolveAxesConfig{
		InputBatch: axes.OutputBatch, InputChannels: axes.OutputChannels, InputSpatial: axes.OutputSpatial,
		KernelInputChannels: axes.KernelOutputChannels, KernelOutputChannels: axes.KernelInputChannels, KernelSpatial: axes.KernelSpatial,
		OutputBatch: axes.InputBatch, OutputChannels: axes.InputChannels, OutputSpatial: axes.InputSpatial,
	}
	inputPads := make([][2]int, numSpatial)
	starts := make([]int, numSpatial)
	for i := range numSpatial {
		low := (w.sizes[i]-1)*w.dilations[i] - w.lowPads[i]
		high := w.inputDims[i] - 1 + w.lowPads[i] - (w.outputDims[i]-1)*w.strides[i]
		inputPads[i] = [2]int{max(0, low), max(0, high)}
		starts[i] = max(0, -low)
	}
	var inputDilations []int
	if slices.ContainsFunc(w.strides, func(s int) bool { return s > 1 }) {
		inputDilations = w.strides
	}
	inputGradient = graph.ConvGeneral(v, reversed, inputAxes, ones, inputPads, inputDilations, w.dilations, 1, 1)
	for i, axis := range axes.InputSpatial {
		if starts[i] != 0 || inputGradient.Shape().Dimensions[axis] != w.inputDims[i] {
			inputGradient = sliceAxis(inputGradient, axis, starts[i], starts[i]+w.inputDims[i], 1)
		}
	}
	return inputGradient, kernelGradient
}

// reverseAxis reverses x along axis (of the given size) with one Slice per position and a Concatenate: the
// pure-Go backend has no Reverse, and the kernels reversed here are small.
func reverseAxis(x *graph.Node, axis, size int) *graph.Node {
	if size == 1 {
		return x
	}
	parts := make([]*graph.Node, size)
	for i := range size {
		parts[i] = sliceAxis(x, axis, size-1-i, size-i, 1)
	}
	return graph.Concatenate(parts, axis)
}
