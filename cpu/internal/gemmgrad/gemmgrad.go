// Package gemmgrad replaces GoMLX's reverse-mode gradients of Dot and DotGeneral with gradients built as
// gemms, which makes training on the pure-Go backend many times faster and smaller.
//
// GoMLX v0.26.0 builds the gradient of each DotGeneral operand as a broadcast Mul of the incoming gradient
// with the other operand followed by a ReduceSum: for a dense layer [batch,in]×[in,out] that materialises a
// batch×in×out tensor per operand. XLA fuses the pattern back into a matrix multiplication; the pure-Go
// backend ("go", simplego) executes it literally, so training spends its time and memory on those tensors.
// The gradient of a DotGeneral is itself a DotGeneral (plus a transpose where the axes land in another
// order), and that is what this package builds instead.
//
// The patch goes through GoMLX's public extension point, graph.VJPRegistration, for graph.NodeTypeDot and
// graph.NodeTypeDotGeneral. What is not public is the DotGeneral node's axes (contracting and batch axes
// of each operand): they live in an unexported struct, which this package reads with reflect. That read
// is verified by CheckCompatible, and every read is checked against the node's shapes, so that a GoMLX
// upgrade that changes the layout fails loudly instead of producing wrong gradients. An accessor for the
// DotGeneral axes on *graph.Node would retire the reflect part; upstream GoMLX has meanwhile fixed the
// gradients themselves ("build DotGeneral gradients as gemms"), after which this package is unnecessary.
//
// Register before building graphs: graph.VJPRegistration is a plain map that graph.Gradient reads without
// a lock, so Register and Unregister must not run while another goroutine builds gradients.
package gemmgrad

import (
	"github.com/gomlx/gomlx/pkg/core/graph"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// patch installs gemmVJP for the node types whose gradients this package builds.
var patch = gomlxpatch.VJPPatch{
	Name:  "gemmgrad",
	Check: CheckCompatible,
	VJPs: map[graph.NodeType]func(replaced graph.VJP) graph.VJP{
		graph.NodeTypeDot:        gemmVJP,
		graph.NodeTypeDotGeneral: gemmVJP,
	},
}

// Register installs the gemm-based gradients of Dot and DotGeneral into graph.VJPRegistration, remembering
// the VJPs it replaces. It is idempotent and safe for concurrent callers, but must not run while graphs
// are being differentiated (see the package documentation). Nodes the gemm gradients do not handle (non
// float dtypes, Dot operands of rank above 2) keep the replaced VJP.
//
// Register panics if CheckCompatible fails: the GoMLX in use no longer stores the DotGeneral axes the way
// this package reads them, and carrying on could only mean wrong gradients or none.
func Register() { patch.Register() }

// Unregister restores the VJPs that Register replaced, so graphs built afterwards differentiate Dot and
// DotGeneral as GoMLX ships them. It is a no-op when not registered. Graphs already built keep the
// gradients they were built with.
func Unregister() { patch.Unregister() }

// Registered reports whether the gemm-based gradients are installed.
func Registered() bool { return patch.Registered() }
