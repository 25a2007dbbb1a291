package convgraph

import (
	"slices"
	"sync/atomic"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// Form says how this package builds the gradients of a convolution.
type Form int32

const (
	// AsConvolutions (the default) builds both gradients as ConvGenerals: the kernel gradient convolves the
	// input with the output gradient (batch and channels swapping roles), the input gradient convolves the
	// output gradient with the spatially reversed kernel — for a strided convolution one undilated
	// convolution per phase of the strides, interleaved (inputGradientByPhases). A backend with a fast
	// convolution (XLA, or the pure-Go backend with convkernel installed) runs them at gemm speed.
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
// The kernel gradient's high padding is negative where the forward windows never reach the input's last
// positions (a strided convolution whose stride does not divide the input): the convolution then leaves
// those positions out instead of computing kernel positions that are sliced off afterwards (a 1×1 stride-2
// kernel gradient computed 2×2 positions, four times the work). XLA, simplego and convkernel all accept a
// negative high padding. In the input gradient, paddings that would be negative are clamped at zero and
// the surplus output positions sliced off.
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
		kernelPads[i] = [2]int{w.lowPads[i], high}
	}
	kernelGradient = graph.ConvGeneral(x, v, kernelAxes, w.dilations, kernelPads, nil, w.strides, 1, 1)
	for i, axis := range axes.KernelSpatial {
		if kernelGradient.Shape().Dimensions[axis] != w.sizes[i] {
			kernelGradient = sliceAxis(kernelGradient, axis, 0, w.sizes[i], 1)
		}
	}

	// Input gradient: v convolved with the reversed kernel, whose input and output channels swap roles.
	inputAxes := backends.ConvolveAxesConfig{
		InputBatch: axes.OutputBatch, InputChannels: axes.OutputChannels, InputSpatial: axes.OutputSpatial,
		KernelInputChannels: axes.KernelOutputChannels, KernelOutputChannels: axes.KernelInputChannels, KernelSpatial: axes.KernelSpatial,
		OutputBatch: axes.InputBatch, OutputChannels: axes.InputChannels, OutputSpatial: axes.InputSpatial,
	}
	if w.byPhases() {
		return conv.inputGradientByPhases(kernel, v, axes, inputAxes), kernelGradient
	}
	reversed := kernel
	for i, axis := range axes.KernelSpatial {
		reversed = reverseAxis(reversed, axis, w.sizes[i])
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

// byPhases reports whether the input gradient is built phase by phase (inputGradientByPhases): where some
// stride exceeds 1, with no kernel dilation, no negative padding and an input at least a stride long (so
// that every phase has positions).
func (w windowGeometry) byPhases() bool {
	strided := false
	for i := range w.sizes {
		if w.dilations[i] != 1 || w.lowPads[i] < 0 || w.inputDims[i] < w.strides[i] {
			return false
		}
		strided = strided || w.strides[i] > 1
	}
	return strided
}

// inputGradientByPhases is the input gradient of a strided convolution without the zeros that dilating v
// by the strides inserts: three quarters of a stride-2 convolution's dilated v are zeros, and a convolution
// over it spends three quarters of its multiply-adds on them. Per spatial axis with stride s, the input
// positions i = s·a + r of one phase r receive only the kernel taps k ≡ r + p (mod s):
//
//	gradient[s·a + r] = Σ_j v[a + c − j]·w[k₀ + s·j]       k₀ = (r + p) mod s, c = (r + p − k₀)/s
//
// an undilated convolution of v by the phase's taps, reversed, with low padding J − 1 − c (J taps). Each
// combination of phases is one ConvGeneral; their results are interleaved into the input's positions. A
// phase with no taps (a kernel smaller than the stride) receives zeros.
func (conv *convLayout) inputGradientByPhases(kernel, v *graph.Node, axes, inputAxes backends.ConvolveAxesConfig) *graph.Node {
	w := conv.windows
	numSpatial := len(w.sizes)
	ones := make([]int, numSpatial)
	for i := range ones {
		ones[i] = 1
	}
	// phase computes the gradient at the positions of one combination of phases.
	phase := func(phases []int) *graph.Node {
		sub := kernel
		pads := make([][2]int, numSpatial)
		type cut struct{ axis, start, size int }
		var cuts []cut
		outDims := v.Shape().Clone().Dimensions
		outDims[inputAxes.OutputBatch] = v.Shape().Dimensions[axes.OutputBatch]
		outDims[inputAxes.OutputChannels] = kernel.Shape().Dimensions[axes.KernelInputChannels]
		empty := false
		for i := range numSpatial {
			s, r, p, size := w.strides[i], phases[i], w.lowPads[i], w.sizes[i]
			first := (r + p) % s
			taps := 0
			if first < size {
				taps = (size-1-first)/s + 1
			}
			c := (r + p - first) / s
			positions := (w.inputDims[i] - r + s - 1) / s
			outDims[inputAxes.OutputSpatial[i]] = positions
			if taps == 0 {
				empty = true
				continue
			}
			axis := axes.KernelSpatial[i]
			if taps != size || s != 1 {
				sub = sliceAxis(sub, axis, first, first+(taps-1)*s+1, s)
			}
			sub = reverseAxis(sub, axis, taps)
			// Output a reads v[a − low + t]; negative paddings are clamped and the surplus sliced off.
			low := taps - 1 - c
			start := max(0, -low)
			high := positions + start - w.outputDims[i] - max(0, low) + taps - 1
			pads[i] = [2]int{max(0, low), max(0, high)}
			cuts = append(cuts, cut{axis: axes.InputSpatial[i], start: start, size: positions})
		}
		if empty {
			return graph.Zeros(v.Graph(), shapes.Make(v.DType(), outDims...))
		}
		gradient := graph.ConvGeneral(v, sub, inputAxes, ones, pads, nil, ones, 1, 1)
		for _, cut := range cuts {
			if cut.start != 0 || gradient.Shape().Dimensions[cut.axis] != cut.size {
				gradient = sliceAxis(gradient, cut.axis, cut.start, cut.start+cut.size, 1)
			}
		}
		return gradient
	}
	var build func(phases []int) *graph.Node
	build = func(phases []int) *graph.Node {
		i := len(phases)
		if i == numSpatial {
			return phase(phases)
		}
		parts := make([]*graph.Node, w.strides[i])
		for r := range parts {
			parts[r] = build(append(slices.Clone(phases), r))
		}
		return interleave(parts, axes.InputSpatial[i], w.inputDims[i])
	}
	return build(nil)
}

// interleave merges parts along axis into size positions: position s·a + r (s = len(parts)) is part r's
// position a. Part r holds ⌈(size − r)/s⌉ positions; shorter parts are padded with zeros to the longest,
// each gets an axis of 1 after axis, they are concatenated there and the two axes merged.
func interleave(parts []*graph.Node, axis, size int) *graph.Node {
	s := len(parts)
	if s == 1 {
		return parts[0]
	}
	longest := (size + s - 1) / s
	for r, part := range parts {
		dims := part.Shape().Clone().Dimensions
		if short := longest - dims[axis]; short > 0 {
			dims[axis] = short
			part = graph.Concatenate([]*graph.Node{part, graph.Zeros(part.Graph(), shapes.Make(part.DType(), dims...))}, axis)
			dims[axis] = longest
		}
		parts[r] = graph.Reshape(part, slices.Insert(dims, axis+1, 1)...)
	}
	merged := graph.Concatenate(parts, axis+1)
	dims := parts[0].Shape().Clone().Dimensions
	dims[axis] *= s
	dims = slices.Delete(dims, axis+1, axis+2)
	merged = graph.Reshape(merged, dims...)
	if longest*s != size {
		merged = sliceAxis(merged, axis, 0, size, 1)
	}
	return merged
}
