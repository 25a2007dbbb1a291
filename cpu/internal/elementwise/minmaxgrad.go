package elementwise

import (
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// GoMLX (v0.26.0) differentiates Max(x, y) — and so ReLU, which is Max(x, 0) — by multiplying the output
// gradient with NonNegativeIndicator(x − y) = Sign(Sign(x − y) + 1): five passes over every activation,
// two of them branchy Signs. The same indicator is GreaterOrEqual(x, y) converted to the dtype: three
// passes, with no Sign. Ties send the gradient where GoMLX does (x for Max, y for Min); the results differ only where x or y is
// NaN (GoMLX's indicator is 1 there, this one 0), and a NaN activation makes the loss NaN either way.
var minMaxPatch = gomlxpatch.VJPPatch{
	Name: "elementwise",
	VJPs: map[graph.NodeType]func(replaced graph.VJP) graph.VJP{
		graph.NodeTypeMax: minMaxVJP,
		graph.NodeTypeMin: minMaxVJP,
	},
}

// RegisterGradients installs the cheaper gradients of Max and Min into graph.VJPRegistration (see
// gemmgrad.Register for the rules of registration). Other configurations (operands of different shapes,
// Jacobians) keep the replaced VJP.
func RegisterGradients() { minMaxPatch.Register() }

// UnregisterGradients restores GoMLX's gradients of Max and Min.
func UnregisterGradients() { minMaxPatch.Unregister() }

func minMaxVJP(replaced graph.VJP) graph.VJP {
	return gomlxpatch.WithFallback("elementwise", func(node *graph.Node, outputVJPs []*graph.Node,
		outputShape shapes.Shape) ([]*graph.Node, bool) {
		inputs := node.Inputs()
		if len(inputs) != 2 || len(outputVJPs) != 1 || outputVJPs[0] == nil || !outputShape.IsScalar() ||
			!node.DType().IsFloat() || !inputs[0].Shape().Equal(node.Shape()) || !inputs[1].Shape().Equal(node.Shape()) {
			return nil, false
		}
		x, y, v := inputs[0], inputs[1], outputVJPs[0]
		first := graph.GreaterOrEqual(x, y) // Max: x takes ties, as in GoMLX.
		if node.Type() == graph.NodeTypeMin {
			first = graph.LessThan(x, y) // Min: y takes ties, as in GoMLX.
		}
		xSide := graph.ConvertDType(first, v.DType())
		return []*graph.Node{graph.Mul(v, xSide), graph.Mul(v, graph.OneMinus(xSide))}, true
	}, replaced)
}
