package fusion

import (
	"math"
	"slices"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/broadcast"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// Row kernels: chains that cross a reduction along the last axis, which element-wise fusion cannot take
// (a reduction's result is per row, and the chain after it reads every element again). GoMLX v0.26.0 builds
// a softmax as a max, a subtraction, an exponential, a sum and a division (graph.Softmax; MaskedSoftmax,
// which attention uses, adds a Where before and after each), and a layer norm as a mean, a centring, a
// variance, a division and the gain and offset (layers.LayerNormalization); their gradients are built
// operation by operation from those. Each is recognised here in the backend's graph, node for node as that
// release builds it, and its last node is rewritten into one that computes the whole of it a row at a time,
// with the row in the first-level cache between its passes:
//
//   - the softmax forward replays GoMLX's operations on each row (the same float32 operations on the same
//     values: the same bits), skipping the masked tail of a row whose mask is a prefix (causal attention);
//   - the softmax's gradient with respect to its logits is y·(g − Σ y·g), from the softmax's output y and
//     the incoming gradient g, instead of GoMLX's six passes over the exponentials and the sums;
//   - the layer norm forward replays GoMLX's operations on each row (the same bits);
//   - the layer norm's gradient with respect to its input, and the incoming gradient times the normalised
//     values (the gain's gradient sums them), recompute the row's mean and deviation and replay GoMLX's
//     gradient operations (the same bits): the forward's intermediate values are then read by nothing else,
//     and the forward is rewritten in training too.
//
// The intermediate nodes the rewritten ones replace are then read by nothing and never run. A graph built
// any other way is left as it is: every node of a pattern is checked, operation and operands.

// rowKernelsOn turns the row kernels on; benchmarks turn them off to measure the chains they replace.
var rowKernelsOn = true

// rowKernel is a node's program that runs a row at a time (see rowKernelKinds).
type rowKernel interface {
	run(backend *simplego.Backend, inputs []*simplego.Buffer, inputsOwned []bool) (*simplego.Buffer, error)
	name() string
}

// constants reads the values of Constant nodes: simplego keeps them as buffers, whose data only a
// backend hands out; BufferData reads nothing of the backend's but whether it was finalized.
var constants = new(simplego.Backend)

func opOf(n *simplego.Node) backends.OpType {
	op, _ := gomlxpatch.NodeOpType(n)
	return op
}

// is returns n's inputs when n is an op of that type with that many inputs.
func is(n *simplego.Node, op backends.OpType, numInputs int) ([]*simplego.Node, bool) {
	if n == nil || opOf(n) != op || gomlxpatch.NodeHasMultipleOutputs(n) {
		return nil, false
	}
	in := gomlxpatch.NodeInputs(n)
	return in, len(in) == numInputs
}

// throughReshapes follows Reshape nodes (GoMLX's ReduceAndKeep, and its gradients, reshape per-row
// statistics between [..., 1] and [...], sometimes several times).
func throughReshapes(n *simplego.Node) *simplego.Node {
	for {
		in, ok := is(n, backends.OpTypeReshape, 1)
		if !ok {
			return n
		}
		n = in[0]
	}
}

// sameRows reports whether a and b are the same per-row values: the same node, through reshapes and (for b
// only) a BroadcastInDim that keeps axes in order, which a binary operation's implicit broadcast makes of it.
func sameRows(a, b *simplego.Node) bool {
	a, b = throughReshapes(a), throughReshapes(b)
	if src, _, ok := throughBroadcast(b); ok {
		b = throughReshapes(src)
	}
	return a == b
}

// lastAxisReduce returns the operand of n (through reshapes) when n is a reduction of type op along the
// operand's last axis only, of float32 values.
func lastAxisReduce(n *simplego.Node, op backends.OpType) (*simplego.Node, bool) {
	n = throughReshapes(n)
	in, ok := is(n, op, 1)
	if !ok {
		return nil, false
	}
	axes, ok := gomlxpatch.NodeData(n).([]int)
	shape := shapeOf(in[0])
	if !ok || shape.DType != dtypes.Float32 || shape.Rank() < 1 || len(axes) != 1 || axes[0] != shape.Rank()-1 {
		return nil, false
	}
	return in[0], true
}

// scalarConstant returns the value of a float32 Constant of one element, read through reshapes and
// broadcasts (GoMLX's ZerosLike and the masking value are broadcast constants).
func scalarConstant(n *simplego.Node) (float32, bool) {
	for {
		n = throughReshapes(n)
		in, ok := is(n, backends.OpTypeBroadcastInDim, 1)
		if !ok {
			break
		}
		n = in[0]
	}
	if opOf(n) != backends.OpTypeConstant || len(gomlxpatch.NodeInputs(n)) != 0 {
		return 0, false
	}
	shape := shapeOf(n)
	buf, ok := gomlxpatch.NodeData(n).(*simplego.Buffer)
	if !ok || shape.DType != dtypes.Float32 || shape.Size() != 1 {
		return 0, false
	}
	data, err := constants.BufferData(buf)
	if err != nil {
		return 0, false
	}
	flat, ok := data.([]float32)
	if !ok || len(flat) != 1 {
		return 0, false
	}
	return flat[0], true
}

// isPositiveZero reports whether n is a broadcast +0 (ZerosLike).
func isPositiveZero(n *simplego.Node) bool {
	v, ok := scalarConstant(n)
	return ok && math.Float32bits(v) == 0
}

// unmask returns what a masked softmax's Where(mask, v, 0) selects, v; for an unmasked softmax (mask nil)
// the node itself.
func unmask(n, mask *simplego.Node) (*simplego.Node, bool) {
	if mask == nil {
		return n, true
	}
	in, ok := is(n, backends.OpTypeWhere, 3)
	if !ok || in[0] != mask || !isPositiveZero(in[2]) {
		return nil, false
	}
	return in[1], true
}

// softmaxMatch is a softmax forward found in the graph.
type softmaxMatch struct {
	root      *simplego.Node // the result, rewritten
	logits    *simplego.Node
	mask      *simplego.Node // boolean, of the logits' shape; nil when unmasked
	maskValue float32        // what the max-reduction reads at masked positions
	exp       *simplego.Node // Exp(logits − max), before masking: its gradient reads it
	masked    *simplego.Node // the exponentials after masking (exp when unmasked)
	sum       *simplego.Node // their ReduceSum
}

// matchSoftmax recognises graph.Softmax(x, -1) and graph.MaskedSoftmax(x, mask, -1) of GoMLX v0.26.0
// ending at root:
//
//	max    = StopGradient(Reshape(ReduceMax(Where(mask, x, lowest))))   (unmasked: of x)
//	exp    = Exp(Where(mask, Sub(x, max), 0))                            (unmasked: no Where)
//	masked = Where(mask, exp, 0)
//	root   = Where(mask, Div(masked, Reshape(ReduceSum(masked))), 0)
func matchSoftmax(root *simplego.Node) (softmaxMatch, bool) {
	shape := shapeOf(root)
	if shape.DType != dtypes.Float32 || shape.Rank() < 1 {
		return softmaxMatch{}, false
	}
	var m softmaxMatch
	m.root = root
	div := root
	if in, ok := is(root, backends.OpTypeWhere, 3); ok {
		m.mask = in[0]
		if !isPositiveZero(in[2]) {
			return softmaxMatch{}, false
		}
		div = in[1]
		if ms := shapeOf(m.mask); ms.DType != dtypes.Bool || !slices.Equal(ms.Dimensions, shape.Dimensions) {
			return softmaxMatch{}, false
		}
	}
	in, ok := is(div, backends.OpTypeDiv, 2)
	if !ok {
		return softmaxMatch{}, false
	}
	m.masked = in[0]
	summed, ok := lastAxisReduce(in[1], backends.OpTypeReduceSum)
	if !ok || summed != m.masked || !shapeOf(m.masked).Equal(shape) {
		return softmaxMatch{}, false
	}
	m.sum = throughReshapes(in[1])
	if m.exp, ok = unmask(m.masked, m.mask); !ok {
		return softmaxMatch{}, false
	}
	expIn, ok := is(m.exp, backends.OpTypeExp, 1)
	if !ok {
		return softmaxMatch{}, false
	}
	sub, ok := unmask(expIn[0], m.mask)
	if !ok {
		return softmaxMatch{}, false
	}
	subIn, ok := is(sub, backends.OpTypeSub, 2)
	if !ok {
		return softmaxMatch{}, false
	}
	m.logits = subIn[0]
	if !shapeOf(m.logits).Equal(shape) {
		return softmaxMatch{}, false
	}
	stopped, ok := is(throughReshapes(subIn[1]), backends.OpTypeIdentity, 1)
	if !ok || gomlxpatch.NodeData(throughReshapes(subIn[1])) != nil {
		return softmaxMatch{}, false
	}
	maxed, ok := lastAxisReduce(stopped[0], backends.OpTypeReduceMax)
	if !ok {
		return softmaxMatch{}, false
	}
	m.maskValue = float32(math.Inf(-1))
	if m.mask == nil {
		return m, maxed == m.logits
	}
	w, ok := is(maxed, backends.OpTypeWhere, 3)
	if !ok || w[0] != m.mask || w[1] != m.logits {
		return softmaxMatch{}, false
	}
	if m.maskValue, ok = scalarConstant(w[2]); !ok {
		return softmaxMatch{}, false
	}
	return m, true
}

// matchSoftmaxGradient recognises, ending at root, the gradient GoMLX v0.26.0 builds for the logits of the
// softmax m, and returns the incoming gradient g of the softmax's result:
//
//	gm   = Where(mask, g, 0)                                     (unmasked: g)
//	dsum = Reshape(ReduceSum(Neg(Mul(gm, Div(masked, Mul(sum, Broadcast(sum)))))))
//	root = Where(mask, Mul(Where(mask, Add(Div(gm, sum), dsum), 0), exp), 0)   (unmasked: no Where)
func matchSoftmaxGradient(root *simplego.Node, m softmaxMatch) (*simplego.Node, bool) {
	if !shapeOf(root).Equal(shapeOf(m.root)) {
		return nil, false
	}
	mul, ok := unmask(root, m.mask)
	if !ok {
		return nil, false
	}
	in, ok := is(mul, backends.OpTypeMul, 2)
	if !ok || in[1] != m.exp {
		return nil, false
	}
	add, ok := unmask(in[0], m.mask)
	if !ok {
		return nil, false
	}
	addIn, ok := is(add, backends.OpTypeAdd, 2)
	if !ok {
		return nil, false
	}
	first, ok := is(addIn[0], backends.OpTypeDiv, 2)
	if !ok || !sameRows(m.sum, first[1]) {
		return nil, false
	}
	gm := first[0]
	g, ok := unmask(gm, m.mask)
	if !ok || !shapeOf(g).Equal(shapeOf(m.root)) {
		return nil, false
	}
	summed, ok := lastAxisReduce(addIn[1], backends.OpTypeReduceSum)
	if !ok {
		return nil, false
	}
	neg, ok := is(summed, backends.OpTypeNeg, 1)
	if !ok {
		return nil, false
	}
	prod, ok := is(neg[0], backends.OpTypeMul, 2)
	if !ok || prod[0] != gm {
		return nil, false
	}
	quot, ok := is(prod[1], backends.OpTypeDiv, 2)
	if !ok || quot[0] != m.masked {
		return nil, false
	}
	square, ok := is(quot[1], backends.OpTypeMul, 2)
	if !ok || !sameRows(m.sum, square[0]) || !sameRows(m.sum, square[1]) {
		return nil, false
	}
	return g, true
}

// layerNormMatch is a layer norm forward found in the graph.
type layerNormMatch struct {
	root               *simplego.Node
	x, gain, offset    *simplego.Node // gain and offset: [..., n] of the row's length
	invN, epsilon      float32
	centred, deviation *simplego.Node
	normalized         *simplego.Node // Div(centred, deviation)
	scaled             *simplego.Node // Mul(normalized, gain)
}

// matchLayerNorm recognises layers.LayerNormalization(ctx, x, -1) of GoMLX v0.26.0 (float32, a learned gain
// and offset, scaled) ending at root:
//
//	mean      = Reshape(Mul(ReduceSum(x), 1/n))
//	centred   = Sub(x, mean)
//	variance  = Reshape(Mul(ReduceSum(Mul(centred, centred)), 1/n))
//	deviation = Sqrt(Add(variance, ε))
//	root      = Add(Mul(Div(centred, deviation), gain), offset)
func matchLayerNorm(root *simplego.Node) (layerNormMatch, bool) {
	shape := shapeOf(root)
	if shape.DType != dtypes.Float32 || shape.Rank() < 1 {
		return layerNormMatch{}, false
	}
	n := shape.Dimensions[shape.Rank()-1]
	m := layerNormMatch{root: root}
	// perFeature reads a gain or an offset: n values laid along the last axis only.
	perFeature := func(node *simplego.Node) (*simplego.Node, bool) {
		s := shapeOf(node)
		return node, s.DType == dtypes.Float32 && s.Size() == n && s.Rank() == shape.Rank() &&
			s.Dimensions[s.Rank()-1] == n
	}
	in, ok := is(root, backends.OpTypeAdd, 2)
	if !ok {
		return m, false
	}
	if m.offset, ok = perFeature(in[1]); !ok {
		return m, false
	}
	mul, ok := is(in[0], backends.OpTypeMul, 2)
	if !ok {
		return m, false
	}
	m.scaled = in[0]
	if m.gain, ok = perFeature(mul[1]); !ok {
		return m, false
	}
	div, ok := is(mul[0], backends.OpTypeDiv, 2)
	if !ok || !shapeOf(div[0]).Equal(shape) {
		return m, false
	}
	m.centred, m.deviation, m.normalized = div[0], throughReshapes(div[1]), mul[0]
	sub, ok := is(m.centred, backends.OpTypeSub, 2)
	if !ok || !shapeOf(sub[0]).Equal(shape) {
		return m, false
	}
	m.x = sub[0]
	// meanOf returns what Reshape(Mul(ReduceSum(v), 1/n)) averages, and 1/n as the graph holds it.
	meanOf := func(node *simplego.Node) (*simplego.Node, float32, bool) {
		scaled, ok := is(throughReshapes(node), backends.OpTypeMul, 2)
		if !ok {
			return nil, 0, false
		}
		inv, ok := scalarConstant(scaled[1])
		if !ok || shapeOf(scaled[1]).Size() != 1 {
			return nil, 0, false
		}
		summed, ok := lastAxisReduce(scaled[0], backends.OpTypeReduceSum)
		return summed, inv, ok
	}
	var inv float32
	if averaged, invMean, ok := meanOf(sub[1]); !ok || averaged != m.x {
		return m, false
	} else {
		inv = invMean
	}
	sqrt, ok := is(m.deviation, backends.OpTypeSqrt, 1)
	if !ok {
		return m, false
	}
	add, ok := is(sqrt[0], backends.OpTypeAdd, 2)
	if !ok || shapeOf(add[1]).Size() != 1 {
		return m, false
	}
	if m.epsilon, ok = scalarConstant(add[1]); !ok {
		return m, false
	}
	squares, invVar, ok := meanOf(add[0])
	if !ok || math.Float32bits(invVar) != math.Float32bits(inv) {
		return m, false
	}
	sq, ok := is(squares, backends.OpTypeMul, 2)
	if !ok || sq[0] != m.centred || sq[1] != m.centred {
		return m, false
	}
	m.invN = inv
	return m, true
}

// rowValues returns the per-row value a binary operation's operand n repeats along the last axis of out: n
// read through a broadcast (if any) and reshapes, when it lays one value per row of out (its dimensions over
// out's are out's leading ones and 1 last). Anything laid otherwise (a per-column value of a square tensor)
// is nil.
func rowValues(n *simplego.Node, out shapes.Shape) *simplego.Node {
	return laidAs(n, out, func(dims []int) bool {
		last := len(dims) - 1
		return dims[last] == 1 && slices.Equal(dims[:last], out.Dimensions[:last])
	})
}

// featureValues is rowValues for a value per position along the last axis, the same for every row (a gain).
func featureValues(n *simplego.Node, out shapes.Shape) *simplego.Node {
	return laidAs(n, out, func(dims []int) bool {
		last := len(dims) - 1
		return dims[last] == out.Dimensions[last] && broadcast.Product(dims[:last]) == 1
	})
}

// laidAs returns n read through a broadcast (if any) and reshapes when its dimensions, laid over out's
// (the broadcast's, or n's own where the operation broadcasts axes of 1), pass fits; else nil.
func laidAs(n *simplego.Node, out shapes.Shape, fits func(dims []int) bool) *simplego.Node {
	dims := shapeOf(n).Dimensions
	if src, srcDims, ok := throughBroadcast(n); ok {
		n, dims = src, srcDims
	}
	if len(dims) == 0 && out.Rank() > 0 {
		// A scalar operand (GoMLX passes one value as a scalar): ones over out's axes.
		dims = make([]int, out.Rank())
		for i := range dims {
			dims[i] = 1
		}
	}
	if len(dims) != out.Rank() || out.Rank() == 0 || !fits(dims) {
		return nil
	}
	return throughReshapes(n)
}

// scalarOperand returns the scalar constant of a binary node's operand i (read through broadcasts).
func scalarOperand(in []*simplego.Node, i int) (float32, bool) {
	if len(in) <= i {
		return 0, false
	}
	return scalarConstant(in[i])
}

// layerNormGradMatch is a layer norm's gradient with respect to its input, found in the graph.
type layerNormGradMatch struct {
	forward  layerNormMatch
	dy       *simplego.Node // the incoming gradient, of x's shape
	residual *simplego.Node // the input's gradient from elsewhere, added before the mean's; nil: none
	layerNormGradConstants
}

// matchLayerNormGradient recognises, ending at root, the gradient GoMLX v0.26.0 builds for a layer norm that
// forwards (by its centred node) holds, with respect to the layer's input:
//
//	g  = Mul(dy, Broadcast(gain));  σb = Broadcast(deviation)
//	dσ = Reshape(ReduceSum(Neg(Mul(g, Div(centred, Mul(σb, σb))))))
//	k  = Broadcast(Reshape(Mul(Reshape(Mul(dσ, Mul(Div(1, deviation), ½))), 1/n)))
//	a  = Add(Add(Div(g, σb), Mul(k, centred)), Mul(k, centred))
//	root = Add(a, Broadcast(Reshape(Mul(Reshape(Neg(Reshape(ReduceSum(a)))), 1/n))))
//
// or, with another gradient of the input (a residual connection) added first, root = Add(Add(r, a), …).
func matchLayerNormGradient(root *simplego.Node, forwards map[*simplego.Node]layerNormMatch) (layerNormGradMatch, bool) {
	var m layerNormGradMatch
	in, ok := is(root, backends.OpTypeAdd, 2)
	if !ok {
		return m, false
	}
	// The mean of a, negated, broadcast back over the row.
	out := shapeOf(root)
	meanMul, ok := is(rowValues(in[1], out), backends.OpTypeMul, 2)
	if !ok {
		return m, false
	}
	if m.invNMean, ok = scalarOperand(meanMul, 1); !ok {
		return m, false
	}
	neg, ok := is(throughReshapes(meanMul[0]), backends.OpTypeNeg, 1)
	if !ok {
		return m, false
	}
	a, ok := lastAxisReduce(neg[0], backends.OpTypeReduceSum)
	if !ok {
		return m, false
	}
	// When the layer's input is also read elsewhere (a residual connection), GoMLX adds that gradient to a
	// before the mean's: root = Add(Add(residual, a), mean).
	if in[0] != a {
		sum, ok := is(in[0], backends.OpTypeAdd, 2)
		if !ok || (sum[0] != a && sum[1] != a) {
			return m, false
		}
		m.residual = sum[0]
		if sum[0] == a {
			m.residual = sum[1]
		}
		if !shapeOf(m.residual).Equal(shapeOf(root)) {
			return m, false
		}
	}
	// a = (g/σ + k·c) + k·c
	outer, ok := is(a, backends.OpTypeAdd, 2)
	if !ok {
		return m, false
	}
	inner, ok := is(outer[0], backends.OpTypeAdd, 2)
	if !ok {
		return m, false
	}
	kc1, ok1 := is(inner[1], backends.OpTypeMul, 2)
	kc2, ok2 := is(outer[1], backends.OpTypeMul, 2)
	// Each product reads k through a broadcast node of its own.
	if !ok1 || !ok2 || rowValues(kc1[0], out) == nil || rowValues(kc1[0], out) != rowValues(kc2[0], out) || kc1[1] != kc2[1] {
		return m, false
	}
	if m.forward, ok = forwards[kc1[1]]; !ok {
		return m, false
	}
	f := m.forward
	if !shapeOf(root).Equal(shapeOf(f.x)) {
		return m, false
	}
	m.invN, m.epsilon = f.invN, f.epsilon
	// k = dσ·((1/σ)·½)·(1/n), per row.
	kMul, ok := is(rowValues(kc1[0], out), backends.OpTypeMul, 2)
	if !ok {
		return m, false
	}
	if m.invNDeviation, ok = scalarOperand(kMul, 1); !ok {
		return m, false
	}
	dMul, ok := is(throughReshapes(kMul[0]), backends.OpTypeMul, 2)
	if !ok {
		return m, false
	}
	halfMul, ok := is(dMul[1], backends.OpTypeMul, 2)
	if !ok {
		return m, false
	}
	if m.half, ok = scalarOperand(halfMul, 1); !ok {
		return m, false
	}
	inverse, ok := is(halfMul[0], backends.OpTypeDiv, 2)
	if !ok || throughReshapes(inverse[1]) != f.deviation {
		return m, false
	}
	if m.one, ok = scalarOperand(inverse, 0); !ok {
		return m, false
	}
	// dσ = −Σ g·(c/σ²)
	summed, ok := lastAxisReduce(dMul[0], backends.OpTypeReduceSum)
	if !ok {
		return m, false
	}
	negated, ok := is(summed, backends.OpTypeNeg, 1)
	if !ok {
		return m, false
	}
	gu, ok := is(negated[0], backends.OpTypeMul, 2)
	if !ok {
		return m, false
	}
	g := gu[0]
	u, ok := is(gu[1], backends.OpTypeDiv, 2)
	if !ok || u[0] != f.centred {
		return m, false
	}
	squared, ok := is(u[1], backends.OpTypeMul, 2)
	if !ok || rowValues(squared[0], out) != f.deviation || rowValues(squared[1], out) != f.deviation {
		return m, false
	}
	// g/σ, and g = dy·gain.
	scaled, ok := is(inner[0], backends.OpTypeDiv, 2)
	if !ok || scaled[0] != g || rowValues(scaled[1], out) != f.deviation {
		return m, false
	}
	dyGain, ok := is(g, backends.OpTypeMul, 2)
	if !ok || featureValues(dyGain[1], out) != throughReshapes(f.gain) || !shapeOf(dyGain[0]).Equal(out) {
		return m, false
	}
	m.dy = dyGain[0]
	return m, true
}

// maskInput returns the node a row kernel reads a mask from, and the mask's dimensions laid over the rows'
// tensor: the source of a broadcast that keeps axes in order and repeats whole rows (a causal mask is
// [1, T, 1, T] under attention's [b, T, h, T] scores), else the mask itself.
func maskInput(mask *simplego.Node) (*simplego.Node, []int) {
	dims := shapeOf(mask).Dimensions
	if src, srcDims, ok := throughBroadcast(mask); ok && srcDims[len(srcDims)-1] == dims[len(dims)-1] &&
		shapeOf(src).DType == dtypes.Bool {
		return src, srcDims
	}
	return mask, slices.Clone(dims)
}

// rewriteRows finds the softmaxes (with their gradients) and layer norms of the graph computing outputs,
// and rewrites each into a row kernel (see rowKernel). It returns how many nodes it rewrote.
func rewriteRows(outputs []*simplego.Node) (int, error) {
	// Layer norms' gradients first: once they recompute what they read of their forwards, nothing else reads
	// the forwards' intermediate values, and the forwards below become row kernels too.
	layerNormGradients, err := rewriteLayerNormGradients(outputs)
	if err != nil {
		return layerNormGradients, err
	}
	g := newGraph(outputs)
	var rewrites []rowRewrite
	// alone reports whether nothing but its pattern reads a node: a forward whose intermediate results
	// something else still needs (its gradient, when that was not recognised) would only be computed twice.
	alone := func(node *simplego.Node, readers int) bool {
		return !g.isOutput[node] && len(g.consumers[node]) == readers
	}
	var softmaxes []softmaxMatch
	softmaxByExp := map[*simplego.Node]int{}
	for _, node := range g.order {
		if m, ok := matchSoftmax(node); ok {
			softmaxByExp[m.exp] = len(softmaxes)
			softmaxes = append(softmaxes, m)
			continue
		}
		if m, ok := matchLayerNorm(node); ok && alone(m.centred, 2) && alone(m.deviation, 1) &&
			alone(gomlxpatch.NodeInputs(gomlxpatch.NodeInputs(node)[0])[0], 1) {
			kernel := &layerNormKernel{layout: newRowLayout(shapeOf(node), nil), invN: m.invN, epsilon: m.epsilon}
			rewrites = append(rewrites, rowRewrite{node, []*simplego.Node{m.x, m.gain, m.offset}, kernel})
		}
	}
	withMask := func(kernel *softmaxKernel, m softmaxMatch, node *simplego.Node, inputs []*simplego.Node) rowRewrite {
		var maskDims []int
		if m.mask != nil {
			var maskNode *simplego.Node
			maskNode, maskDims = maskInput(m.mask)
			inputs = append(inputs, maskNode)
		}
		kernel.layout = newRowLayout(shapeOf(node), maskDims)
		return rowRewrite{node, inputs, kernel}
	}
	// Gradients, which read their softmax's exponentials.
	gradients := make([]int, len(softmaxes))
	for _, node := range g.order {
		mul := node
		if in, ok := is(node, backends.OpTypeWhere, 3); ok {
			mul = in[1]
		}
		in, ok := is(mul, backends.OpTypeMul, 2)
		if !ok {
			continue
		}
		i, ok := softmaxByExp[in[1]]
		if !ok {
			continue
		}
		m := softmaxes[i]
		grad, ok := matchSoftmaxGradient(node, m)
		if !ok {
			continue
		}
		gradients[i]++
		kernel := &softmaxKernel{maskValue: m.maskValue, masked: m.mask != nil, gradient: true}
		rewrites = append(rewrites, withMask(kernel, m, node, []*simplego.Node{m.root, grad}))
	}
	for i, m := range softmaxes {
		// Unmasked, the exponentials are read by the sum and the division; masked, by the Where that masks
		// them, which the sum and the division read.
		inForward := alone(m.exp, 2)
		if m.mask != nil {
			inForward = alone(m.exp, 1) && alone(m.masked, 2)
		}
		if gradients[i] == 0 && !inForward {
			continue
		}
		kernel := &softmaxKernel{maskValue: m.maskValue, masked: m.mask != nil}
		rewrites = append(rewrites, withMask(kernel, m, m.root, []*simplego.Node{m.logits}))
	}
	// Rewritten only now: the gradients' patterns read nodes of the forwards' (never their roots).
	n, err := applyRowRewrites(rewrites)
	return layerNormGradients + n, err
}

// rowRewrite is a node to become a row kernel reading inputs.
type rowRewrite struct {
	node   *simplego.Node
	inputs []*simplego.Node
	kernel rowKernel
}

// applyRowRewrites rewrites the nodes, once every pattern has been matched (a pattern may read nodes of
// another's), and returns how many it rewrote.
func applyRowRewrites(rewrites []rowRewrite) (int, error) {
	for i, r := range rewrites {
		if err := gomlxpatch.Rewrite(r.node, fusedOpType, r.inputs, r.kernel); err != nil {
			return i, err
		}
	}
	return len(rewrites), nil
}

// rewriteLayerNormGradients rewrites the gradients of layer norms with respect to their inputs into
// layerNormGradKernels, and the products of an incoming gradient with a layer norm's normalised values (the
// gain's gradient sums them) into layerNormProductKernels. It returns how many nodes it rewrote.
func rewriteLayerNormGradients(outputs []*simplego.Node) (int, error) {
	g := newGraph(outputs)
	forwards := map[*simplego.Node]layerNormMatch{}   // by centred node
	normalized := map[*simplego.Node]layerNormMatch{} // by normalised node
	for _, node := range g.order {
		if m, ok := matchLayerNorm(node); ok {
			forwards[m.centred] = m
			normalized[m.normalized] = m
		}
	}
	if len(forwards) == 0 {
		return 0, nil
	}
	var rewrites []rowRewrite
	for _, node := range g.order {
		if m, ok := matchLayerNormGradient(node, forwards); ok {
			layout := newRowLayout(shapeOf(node), nil)
			layout.width = 4
			kernel := &layerNormGradKernel{layout: layout, layerNormGradConstants: m.layerNormGradConstants}
			inputs := []*simplego.Node{m.forward.x, m.forward.gain, m.dy}
			if m.residual != nil {
				kernel.residual = true
				inputs = append(inputs, m.residual)
			}
			rewrites = append(rewrites, rowRewrite{node, inputs, kernel})
			continue
		}
		in, ok := is(node, backends.OpTypeMul, 2)
		if !ok {
			continue
		}
		for i := range in {
			f, ok := normalized[in[i]]
			dy := in[1-i]
			// The forward's own product with the gain has x's shape too when x is a single row.
			if !ok || node == f.scaled || !shapeOf(dy).Equal(shapeOf(node)) || !shapeOf(node).Equal(shapeOf(f.x)) {
				continue
			}
			layout := newRowLayout(shapeOf(node), nil)
			layout.width = 2
			kernel := &layerNormProductKernel{layout: layout, invN: f.invN, epsilon: f.epsilon}
			rewrites = append(rewrites, rowRewrite{node, []*simplego.Node{f.x, dy}, kernel})
			break
		}
	}
	// Rewritten only now: a product's pattern may read a node a gradient's reads.
	return applyRowRewrites(rewrites)
}
