package fusion

import (
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"

	"github.com/goaccel/goaccel/cpu/internal/blas"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// Products through transposes: a DotGeneral whose result only a Transpose reads (through simplego's
// Reshape), or whose operand is a Transpose only products read, becomes one node that runs the gemm reading and
// writing those layouts in place (blas.PlanProduct says when it can). Attention makes six such pairs per
// layer and step: the scores and the weighted values laid back out as [batch, seq, heads, …], and their
// gradients read through the same Transposes. Only where the matrix kernel is blas's (blas.Installed):
// otherwise the DotGeneral stays simplego's. An executable compiled so keeps running blas's kernels if blas
// is uninstalled afterwards, as it keeps running fusion's.

// productsOn turns the rewrite on; tests and benchmarks turn it off to compare with the Transposes.
var productsOn = true

// productKernel runs a planned product.
type productKernel struct{ product *blas.Product }

func (k *productKernel) name() string { return "product through transposes" }

func (k *productKernel) run(backend *simplego.Backend, inputs []*simplego.Buffer, _ []bool) (*simplego.Buffer, error) {
	return k.product.Run(backend, inputs)
}

// rewriteProducts rewrites the products of the graph computing outputs that read an operand or write their
// result through a Transpose, and returns how many it rewrote.
func rewriteProducts(outputs []*simplego.Node) (int, error) {
	if !blas.Installed() {
		return 0, nil
	}
	g := newGraph(outputs)
	only := func(node, consumer *simplego.Node) bool {
		consumers := g.consumers[node]
		return !g.isOutput[node] && len(consumers) == 1 && consumers[0] == consumer
	}
	// rewrittenDots are the DotGenerals this pass made products of in place (no longer DotGeneral nodes).
	rewrittenDots := map[*simplego.Node]bool{}
	isDot := func(node *simplego.Node) bool {
		_, ok := is(node, backends.OpTypeDotGeneral, 2)
		return ok || rewrittenDots[node]
	}
	// onlyProducts reports whether every reader of node is a DotGeneral: a Transpose read by products
	// alone (a gradient's two products, each reading it) need not run once they read through it.
	onlyProducts := func(node *simplego.Node) bool {
		if g.isOutput[node] || len(g.consumers[node]) == 0 {
			return false
		}
		for _, consumer := range g.consumers[node] {
			if !isDot(consumer) {
				return false
			}
		}
		return true
	}
	// operands returns the dot's operands as the arrays to read, through the Transposes only products read.
	operands := func(dot *simplego.Node) (lhs, rhs blas.Operand, inputs []*simplego.Node, through bool) {
		in := gomlxpatch.NodeInputs(dot)
		inputs = []*simplego.Node{in[0], in[1]}
		var layouts [2]blas.Operand
		for i, operand := range in {
			layouts[i] = blas.Operand{Dims: shapeOf(operand).Dimensions}
			source, ok := is(operand, backends.OpTypeTranspose, 1)
			permutation, isPerm := gomlxpatch.NodeData(operand).([]int)
			if !ok || !isPerm || !onlyProducts(operand) {
				continue
			}
			layouts[i] = blas.Operand{Dims: shapeOf(source[0]).Dimensions, Permutation: permutation}
			inputs[i] = source[0]
			through = true
		}
		return layouts[0], layouts[1], inputs, through
	}
	rewritten := 0
	// rewrite makes node (dot, or the Transpose of dot's result by output) the planned product of lhs and
	// rhs (dot's operands, as operands returns them, read from inputs), if dot plans.
	rewrite := func(node, dot *simplego.Node, lhs, rhs blas.Operand, inputs []*simplego.Node, output []int) (bool, error) {
		product, ok := blas.PlanProduct(dot, lhs, rhs, output)
		if !ok || !product.Shape().Equal(shapeOf(node)) {
			return false, nil
		}
		if err := gomlxpatch.Rewrite(node, fusedOpType, inputs, &productKernel{product: product}); err != nil {
			return false, err
		}
		rewritten++
		return true, nil
	}
	absorbed := map[*simplego.Node]bool{}
	// Results read through a Transpose: the Transpose becomes the product.
	for _, node := range g.order {
		in, ok := is(node, backends.OpTypeTranspose, 1)
		permutation, isPerm := gomlxpatch.NodeData(node).([]int)
		if !ok || !isPerm {
			continue
		}
		dot, consumer := in[0], node
		if reshaped, ok := is(dot, backends.OpTypeReshape, 1); ok && only(dot, node) {
			dot, consumer = reshaped[0], dot
		}
		if !isDot(dot) || !only(dot, consumer) {
			continue
		}
		lhs, rhs, inputs, _ := operands(dot)
		done, err := rewrite(node, dot, lhs, rhs, inputs, permutation)
		if err != nil {
			return rewritten, err
		}
		absorbed[dot] = done
	}
	// Operands read through a Transpose: the DotGeneral becomes the product.
	for _, node := range g.order {
		if absorbed[node] || !isDot(node) {
			continue
		}
		lhs, rhs, inputs, through := operands(node)
		if !through {
			continue
		}
		done, err := rewrite(node, node, lhs, rhs, inputs, nil)
		if err != nil {
			return rewritten, err
		}
		rewrittenDots[node] = done
	}
	return rewritten, nil
}
