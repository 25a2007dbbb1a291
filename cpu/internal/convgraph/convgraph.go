// Package convgraph expresses convolutions and pooling as graphs of operations GoMLX's pure-Go backend ("go",
// simplego) can run: Register replaces GoMLX's reverse-mode gradients of convolutions (ConvGeneral) and
// pooling (ReduceWindow) with gradients built from such operations (as convolutions, or as slices and
// dots, see Form), and LowerConvolutions lowers the forward pass of both to slices and dots, which the
// convolution executors of package convkernel have since replaced (it stays for comparison: GOACCEL_CONV=
// graph).
//
// GoMLX v0.26.0 builds these gradients with ops simplego does not implement: the input gradient of a
// convolution reverses the kernel (Reverse) and convolves with input dilations, the gradient of max and
// min pooling is a SelectAndScatter, and that of sum and mean pooling uses Pad. The first gradient of a
// convolutional model on simplego therefore fails with `op "Reverse" not implemented in SimpleGo yet`.
// (GoMLX's input gradient is also off by one position wherever the dilated kernel has an even size, on any
// backend; this package's is not.)
//
// This package builds the same gradients from ops simplego has (Slice, Concatenate, Reshape, Transpose,
// DotGeneral, Equal, Where, ReduceMin, Broadcast):
//
//   - Convolution, as im2col plus one matrix multiplication each. The kernel gradient is the DotGeneral of
//     the input's patches (one strided Slice per kernel position, concatenated) with the output gradient.
//     The input gradient is the DotGeneral of the output gradient with the kernel, giving each kernel
//     position's contribution, and a col2im that adds every contribution back at the input positions it
//     was read from (zeros inserted between outputs for strides, zero padding by Concatenate). No kernel is
//     reversed: a contribution is placed where its kernel position read, which is what convolving with the
//     reversed kernel computes. Dots are also far faster than simplego's direct convolution loop.
//   - Pooling, with no SelectAndScatter or Pad. Non-overlapping windows (window equal to stride on every
//     axis, the default of graph.MaxPool and graph.MeanPool) reshape the input into [..., out, window, ...]
//     and compare it with the broadcast pooled value; other windows compare one strided Slice per window
//     position and add the gradients back with the same col2im as convolutions. Among ties within a window,
//     the whole gradient goes to the first maximum (minimum) in row-major window order, as
//     SelectAndScatter does on XLA.
//
// Configurations not covered keep GoMLX's own VJP: convolutions with input dilations (only gradients of
// gradients have those) or channel or batch grouping, pooling with base or window dilations, product
// pooling, non-float dtypes and Jacobians. Registration is process-wide, for graphs of every backend: on
// XLA the gradients are the same values, built as dots rather than convolutions.
//
// The patch goes through GoMLX's public extension point, graph.VJPRegistration, for
// graph.NodeTypeConvGeneral and graph.NodeTypeReduceWindow. What is not public is each node's parameters
// (axes, strides, paddings, dilations, window sizes, reduction type): they live in unexported structs that
// this package reads with reflect. That read is verified by CheckCompatible, which Register runs, and every
// read is checked against the node's shapes, so that a GoMLX upgrade that changes the layout fails loudly
// instead of producing wrong gradients. Exported accessors for a ConvGeneral and a ReduceWindow node's
// parameters on *graph.Node would retire the reflect part; simplego implementing Reverse, Pad and
// SelectAndScatter would make GoMLX's own gradients run there (slowly, as simplego's direct convolution,
// and once GoMLX passes explicit strides: simplego reads nil ConvGeneral strides as 0).
//
// Register before building graphs: graph.VJPRegistration is a plain map that graph.Gradient reads without
// a lock, so Register and Unregister must not run while another goroutine builds gradients.
package convgraph

import (
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// patch installs this package's gradients, by node type. Each builder returns false for nodes it leaves to
// the VJP it replaced.
var patch = gomlxpatch.VJPPatch{
	Name:  "convgraph",
	Check: CheckCompatible,
	VJPs: map[graph.NodeType]func(replaced graph.VJP) graph.VJP{
		graph.NodeTypeConvGeneral:  withFallback(convGeneralGradients),
		graph.NodeTypeReduceWindow: withFallback(reduceWindowGradients),
	},
}

// Register installs this package's gradients of ConvGeneral and ReduceWindow into graph.VJPRegistration,
// remembering the VJPs it replaces. It is idempotent and safe for concurrent callers, but must not run while
// graphs are being differentiated (see the package documentation). Nodes this package does not handle keep
// the replaced VJP.
//
// Register panics if CheckCompatible fails: the GoMLX in use no longer stores the node parameters the way
// this package reads them, and carrying on could only mean wrong gradients or none.
func Register() { patch.Register() }

// Unregister restores the VJPs that Register replaced, so graphs built afterwards differentiate ConvGeneral
// and ReduceWindow as GoMLX ships them. It is a no-op when not registered. Graphs already built keep the
// gradients they were built with.
func Unregister() { patch.Unregister() }

// Registered reports whether this package's gradients are installed.
func Registered() bool { return patch.Registered() }

// withFallback returns the graph.VJP to install for a node type given the VJP it replaces, fallback:
// build's gradients, or those of fallback for the nodes build leaves alone.
func withFallback(build func(node, v *graph.Node) ([]*graph.Node, bool)) func(fallback graph.VJP) graph.VJP {
	return func(fallback graph.VJP) graph.VJP {
		return gomlxpatch.WithFallback("convgraph",
			func(node *graph.Node, outputVJPs []*graph.Node, outputShape shapes.Shape) ([]*graph.Node, bool) {
				// Only gradients of scalars (outputShape is a scalar) are handled: Jacobians stack extra
				// leading axes onto every VJP.
				if len(outputVJPs) != 1 || outputVJPs[0] == nil || !outputShape.IsScalar() ||
					!node.DType().IsFloat() || !outputVJPs[0].Shape().Equal(node.Shape()) {
					return nil, false
				}
				return build(node, outputVJPs[0])
			}, fallback)
	}
}
