package fusion

import (
	"slices"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/broadcast"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
	"github.com/goaccel/goaccel/internal/vec32"
)

// Result says what Fuse did.
type Result struct {
	Chains int // nodes rewritten to run a program
	Ops    int // element-wise operations those programs compute
	// RowKernels counts the nodes rewritten into row kernels: softmaxes, their gradients, layer norms.
	RowKernels int
	// Products counts the matrix products rewritten to read an operand or write their result through a
	// Transpose in place (see productKernel).
	Products int
	// ConcatAdds counts the additions of a concatenation rewritten to add each part in place (see
	// concatAddKernel): the gradient accumulation of every bucket.
	ConcatAdds int
	// Windows counts the programs' inputs read inside a larger vector instead of through the Slice that
	// would copy them (see contiguousWindow): the gradients an update slices out of its buckets.
	Windows int
}

// Limits of one fused chain: its operations (each a few instructions per element), and so its registers,
// stay few enough that a tile of every live value fits the first-level cache with the inputs' tiles.
const (
	maxChainOps = 48
	// minFusedSize: below it a tensor's whole pass is cheaper than the program's set-up.
	minFusedSize = 16
)

// nodeGraph is what Fuse knows of the nodes reachable from the outputs.
type nodeGraph struct {
	order     []*simplego.Node // post-order: every node after its inputs
	position  map[*simplego.Node]int
	consumers map[*simplego.Node][]*simplego.Node // distinct consumers
	isOutput  map[*simplego.Node]bool
}

func newGraph(outputs []*simplego.Node) *nodeGraph {
	g := &nodeGraph{position: map[*simplego.Node]int{}, consumers: map[*simplego.Node][]*simplego.Node{},
		isOutput: map[*simplego.Node]bool{}}
	visited := map[*simplego.Node]bool{}
	// Iterative post-order: graphs of deep models are thousands of nodes long.
	type frame struct {
		node *simplego.Node
		next int
	}
	for _, out := range outputs {
		g.isOutput[out] = true
		if visited[out] {
			continue
		}
		visited[out] = true
		stack := []frame{{node: out}}
		for len(stack) > 0 {
			top := &stack[len(stack)-1]
			inputs := gomlxpatch.NodeInputs(top.node)
			if top.next < len(inputs) {
				input := inputs[top.next]
				top.next++
				if !slices.Contains(g.consumers[input], top.node) {
					g.consumers[input] = append(g.consumers[input], top.node)
				}
				if !visited[input] {
					visited[input] = true
					stack = append(stack, frame{node: input})
				}
				continue
			}
			g.position[top.node] = len(g.order)
			g.order = append(g.order, top.node)
			stack = stack[:len(stack)-1]
		}
	}
	return g
}

// element is what a fusable node computes, for the program.
type element struct {
	kind   elementKind
	op     vec32.Op
	unary  vec32.Unary
	opType backends.OpType
}

type elementKind uint8

const (
	notElement elementKind = iota
	binaryElement
	unaryElement
	selectElement
	convertElement // bool (held as 1 or 0) to float32, or a float32 Identity: the value itself
)

var binaryOps = map[backends.OpType]vec32.Op{
	backends.OpTypeAdd: vec32.Add, backends.OpTypeSub: vec32.Sub, backends.OpTypeMul: vec32.Mul,
	backends.OpTypeDiv: vec32.Div, backends.OpTypeMax: vec32.Max, backends.OpTypeMin: vec32.Min,
	backends.OpTypeEqual: vec32.Equal, backends.OpTypeNotEqual: vec32.NotEqual,
	backends.OpTypeLessThan: vec32.LessThan, backends.OpTypeLessOrEqual: vec32.LessOrEqual,
	backends.OpTypeGreaterThan: vec32.GreaterThan, backends.OpTypeGreaterOrEqual: vec32.GreaterOrEqual,
}

var unaryOps = map[backends.OpType]vec32.Unary{
	backends.OpTypeNeg: vec32.Neg, backends.OpTypeAbs: vec32.Abs, backends.OpTypeSqrt: vec32.Sqrt,
	backends.OpTypeExp: vec32.Exp, backends.OpTypeErf: vec32.Erf,
}

// classify says what node computes, if it is an element-wise operation a program can run: float32
// arithmetic, comparisons of float32 (whose booleans a program holds as 1 and 0), Where choosing between
// float32 values, conversions of booleans to float32, and float32 Identity nodes. Operands must have the node's shape, a single
// element, or (for binary operations) a broadcast of a contiguous run of its axes.
func classify(node *simplego.Node) element {
	opType, ok := gomlxpatch.NodeOpType(node)
	if !ok || gomlxpatch.NodeHasMultipleOutputs(node) {
		return element{}
	}
	shape, ok := gomlxpatch.NodeShape(node)
	if !ok {
		return element{}
	}
	inputs := gomlxpatch.NodeInputs(node)
	operand := func(i int, dtype dtypes.DType, allowBroadcast bool) bool {
		s, ok := gomlxpatch.NodeShape(inputs[i])
		if !ok || s.DType != dtype || gomlxpatch.NodeHasMultipleOutputs(inputs[i]) {
			return false
		}
		if s.Size() == 1 || slices.Equal(s.Dimensions, shape.Dimensions) {
			return true
		}
		if !allowBroadcast {
			return false
		}
		_, ok = broadcast.Of(s.Dimensions, shape.Dimensions)
		return ok
	}
	if op, ok := binaryOps[opType]; ok && len(inputs) == 2 {
		isCompare := op >= vec32.Equal
		if (isCompare && shape.DType != dtypes.Bool) || (!isCompare && shape.DType != dtypes.Float32) {
			return element{}
		}
		if operand(0, dtypes.Float32, true) && operand(1, dtypes.Float32, true) {
			return element{kind: binaryElement, op: op, opType: opType}
		}
		return element{}
	}
	if u, ok := unaryOps[opType]; ok && len(inputs) == 1 && shape.DType == dtypes.Float32 &&
		operand(0, dtypes.Float32, false) {
		return element{kind: unaryElement, unary: u, opType: opType}
	}
	switch opType {
	case backends.OpTypeWhere:
		if len(inputs) == 3 && shape.DType == dtypes.Float32 && operand(0, dtypes.Bool, false) &&
			operand(1, dtypes.Float32, false) && operand(2, dtypes.Float32, false) {
			return element{kind: selectElement, opType: opType}
		}
	case backends.OpTypeConvertDType:
		if len(inputs) == 1 && shape.DType == dtypes.Float32 && operand(0, dtypes.Bool, false) {
			return element{kind: convertElement, opType: opType}
		}
	case backends.OpTypeIdentity:
		// GoMLX's StopGradient and custom gradients are Identity nodes: inside a chain they are the value
		// itself, where simplego would copy a tensor that something else still reads. A fused node is an
		// Identity too, but carries its program: never the value of its input.
		if len(inputs) == 1 && gomlxpatch.NodeData(node) == nil && shape.DType == dtypes.Float32 &&
			operand(0, dtypes.Float32, false) {
			return element{kind: convertElement, opType: opType}
		}
	}
	return element{}
}

// chain is a group of nodes that one program computes: its root (whose node is rewritten) and the nodes
// whose only consumer is in the chain.
type chain struct {
	root    *simplego.Node
	members []*simplego.Node
}

// Fuse rewrites the graph that computes outputs (nodes of one simplego builder that has not compiled yet)
// so that every chain of element-wise float32 operations runs as one node: the chain's last node keeps its
// place and shape but becomes a fused node (see fusedOpType) whose inputs are the chain's inputs and whose
// parameters are a program; the chain's other nodes are no longer reachable from the outputs.
func Fuse(outputs []*simplego.Node) (Result, error) {
	if err := gomlxpatch.CheckSimplegoLayout(); err != nil {
		return Result{}, err
	}
	// Row kernels first: element-wise chains would otherwise take the element-wise parts of the softmaxes
	// and layer norms they replace.
	var rowNodes int
	if rowKernelsOn {
		var err error
		if rowNodes, err = rewriteRows(outputs); err != nil {
			return Result{RowKernels: rowNodes}, err
		}
	}
	var products int
	if productsOn {
		var err error
		if products, err = rewriteProducts(outputs); err != nil {
			return Result{RowKernels: rowNodes, Products: products}, err
		}
	}
	var concatAdds int
	if concatAddsOn {
		var err error
		if concatAdds, err = rewriteConcatAdds(outputs); err != nil {
			return Result{RowKernels: rowNodes, Products: products, ConcatAdds: concatAdds}, err
		}
	}
	g := newGraph(outputs)
	elements := map[*simplego.Node]element{}
	chainOf := map[*simplego.Node]*chain{}
	var chains []*chain
	// From the outputs back: every consumer is decided before the nodes it reads.
	for i := len(g.order) - 1; i >= 0; i-- {
		node := g.order[i]
		e := classify(node)
		if e.kind == notElement {
			continue
		}
		elements[node] = e
		shape, _ := gomlxpatch.NodeShape(node)
		if consumers := g.consumers[node]; !g.isOutput[node] && len(consumers) == 1 {
			if c := chainOf[consumers[0]]; c != nil && len(c.members) < maxChainOps {
				consumerShape, _ := gomlxpatch.NodeShape(consumers[0])
				if slices.Equal(shape.Dimensions, consumerShape.Dimensions) {
					c.members = append(c.members, node)
					chainOf[node] = c
					continue
				}
			}
		}
		if shape.DType == dtypes.Float32 && shape.Size() >= minFusedSize {
			c := &chain{root: node, members: []*simplego.Node{node}}
			chainOf[node] = c
			chains = append(chains, c)
		}
	}
	result := Result{RowKernels: rowNodes, Products: products, ConcatAdds: concatAdds}
	for _, c := range chains {
		// Inputs before the nodes that read them.
		slices.SortFunc(c.members, func(a, b *simplego.Node) int { return g.position[a] - g.position[b] })
		p, leaves := compile(c, elements, chainOf)
		if err := gomlxpatch.Rewrite(c.root, fusedOpType, leaves, p); err != nil {
			return result, err
		}
		result.Chains++
		result.Ops += len(c.members)
		for _, l := range p.leaves {
			if l.window {
				result.Windows++
			}
		}
	}
	return result, nil
}

// shapeOf is the node's output shape (the layout was checked by Fuse).
func shapeOf(node *simplego.Node) shapes.Shape {
	shape, _ := gomlxpatch.NodeShape(node)
	return shape
}

// throughBroadcast returns, for a BroadcastInDim that keeps its source's axes in order (inserting axes, or
// repeating axes of size 1), the source and its dimensions laid over the output's axes (1 elsewhere): a
// fused node can read the source with that pattern instead of the broadcast's materialised result.
func throughBroadcast(node *simplego.Node) (source *simplego.Node, dims []int, ok bool) {
	opType, ok := gomlxpatch.NodeOpType(node)
	if !ok || opType != backends.OpTypeBroadcastInDim {
		return nil, nil, false
	}
	axes, ok := gomlxpatch.NodeData(node).([]int)
	inputs := gomlxpatch.NodeInputs(node)
	if !ok || len(inputs) != 1 || gomlxpatch.NodeHasMultipleOutputs(inputs[0]) {
		return nil, nil, false
	}
	out, in := shapeOf(node), shapeOf(inputs[0])
	if len(axes) != in.Rank() || in.DType != out.DType {
		return nil, nil, false
	}
	dims = make([]int, out.Rank())
	for i := range dims {
		dims[i] = 1
	}
	for i, axis := range axes {
		if axis < 0 || axis >= len(dims) || (i > 0 && axis <= axes[i-1]) {
			return nil, nil, false // a transposing broadcast
		}
		dims[axis] = in.Dimensions[i]
	}
	return inputs[0], dims, true
}
