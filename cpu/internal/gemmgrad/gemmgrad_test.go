package gemmgrad

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
)

// gradientCase is a product of two operands whose gradients are compared between GoMLX's VJPs and ours.
type gradientCase struct {
	name             string
	lhsDims, rhsDims []int
	product          func(lhs, rhs *graph.Node) *graph.Node
}

// namedCases are the products models use: graph.Dot in its three forms, dense layers of rank 3, attention.
var namedCases = []gradientCase{
	{"Dot/matrix·matrix", []int{5, 3}, []int{3, 4}, graph.Dot},
	{"Dot/matrix·vector", []int{5, 3}, []int{3}, graph.Dot},
	{"Dot/vector·vector", []int{3}, []int{3}, graph.Dot},
	{"DotGeneral/dense[B,T,D]×[D,E]", []int{2, 3, 4}, []int{4, 5}, func(lhs, rhs *graph.Node) *graph.Node {
		return graph.DotGeneral(lhs, []int{2}, nil, rhs, []int{0}, nil)
	}},
	{"MatMul/dense[B,T,D]×[D,E]", []int{2, 3, 4}, []int{4, 5}, graph.MatMul},
	{"Einsum/btd,de->bte", []int{2, 3, 4}, []int{4, 5}, func(lhs, rhs *graph.Node) *graph.Node {
		return graph.Einsum("btd,de->bte", lhs, rhs)
	}},
	{"Einsum/bqd,bkd->bqk", []int{2, 3, 4}, []int{2, 5, 4}, func(lhs, rhs *graph.Node) *graph.Node {
		return graph.Einsum("bqd,bkd->bqk", lhs, rhs)
	}},
	{"Einsum/bqk,bkd->bqd", []int{2, 3, 5}, []int{2, 5, 4}, func(lhs, rhs *graph.Node) *graph.Node {
		return graph.Einsum("bqk,bkd->bqd", lhs, rhs)
	}},
	{"Einsum/bhqd,bhkd->bhqk", []int{2, 3, 4, 5}, []int{2, 3, 6, 5}, func(lhs, rhs *graph.Node) *graph.Node {
		return graph.Einsum("bhqd,bhkd->bhqk", lhs, rhs)
	}},
	{"DotGeneral/outer product", []int{3, 2}, []int{4}, func(lhs, rhs *graph.Node) *graph.Node {
		return graph.DotGeneral(lhs, nil, nil, rhs, nil, nil)
	}},
}

// randomLayoutCase returns a DotGeneral of 0–2 batch axes, 1–3 contracting axes and 0–2 cross axes per
// operand, each operand's axes in a random order, and the contracting and batch axes paired in a random
// order too.
func randomLayoutCase(rng *rand.Rand, index int) gradientCase {
	numBatch, numContracting := rng.IntN(3), 1+rng.IntN(3)
	numLhsCross, numRhsCross := rng.IntN(3), rng.IntN(3)
	randomDims := func(n int) []int {
		dims := make([]int, n)
		for i := range dims {
			dims[i] = 1 + rng.IntN(4)
		}
		return dims
	}
	batchDims, contractingDims := randomDims(numBatch), randomDims(numContracting)

	// layout places an operand's axes, listed by role, at random positions: it returns the operand's
	// dimensions and where its batch and contracting axes went.
	layout := func(crossDims []int) (dims, batchAxes, contractingAxes []int) {
		byRole := append(append(append([]int{}, batchDims...), contractingDims...), crossDims...)
		position := rng.Perm(len(byRole))
		dims = make([]int, len(byRole))
		for role, axis := range position {
			dims[axis] = byRole[role]
		}
		return dims, position[:numBatch], position[numBatch : numBatch+numContracting]
	}
	lhsDims, lhsBatch, lhsContracting := layout(randomDims(numLhsCross))
	rhsDims, rhsBatch, rhsContracting := layout(randomDims(numRhsCross))
	return gradientCase{
		name: fmt.Sprintf("random#%03d/lhs%v(c%v,b%v)×rhs%v(c%v,b%v)", index,
			lhsDims, lhsContracting, lhsBatch, rhsDims, rhsContracting, rhsBatch),
		lhsDims: lhsDims,
		rhsDims: rhsDims,
		product: func(lhs, rhs *graph.Node) *graph.Node {
			return graph.DotGeneral(lhs, lhsContracting, lhsBatch, rhs, rhsContracting, rhsBatch)
		},
	}
}

const numRandomLayouts = 320

// TestGradientsAgreeWithGoMLX compares, for every case in float32 and float64, the gradients of a
// randomly weighted sum of the product with respect to both operands, built once by GoMLX's own VJPs and
// once by ours, in the same graph, executed on the pure-Go backend.
func TestGradientsAgreeWithGoMLX(t *testing.T) {
	rng := rand.New(rand.NewPCG(2024, 7))
	cases := append([]gradientCase{}, namedCases...)
	for i := range numRandomLayouts {
		cases = append(cases, randomLayoutCase(rng, i))
	}

	worstByDType := map[dtypes.DType]float64{}
	for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64} {
		for _, tc := range cases {
			t.Run(dtype.String()+"/"+tc.name, func(t *testing.T) {
				worst := compareGradients(t, rng, tc, dtype)
				worstByDType[dtype] = max(worstByDType[dtype], worst)
				assert.LessOrEqual(t, worst, 1e-5)
			})
		}
	}
	t.Logf("%d cases (%d random layouts) per dtype; max relative error: float32 %.3g, float64 %.3g",
		len(cases), numRandomLayouts, worstByDType[dtypes.Float32], worstByDType[dtypes.Float64])
}

// compareGradients builds the gradients of tc with GoMLX's VJPs and with ours and returns their largest
// relative difference. It fails if our VJP would not handle one of the product's Dot/DotGeneral nodes.
func compareGradients(t *testing.T, rng *rand.Rand, tc gradientCase, dtype dtypes.DType) float64 {
	t.Helper()
	g := graph.NewGraph(computetest.PureGo(t), "compare")
	defer g.Finalize()
	lhs := graph.Parameter(g, "lhs", shapes.Make(dtype, tc.lhsDims...))
	rhs := graph.Parameter(g, "rhs", shapes.Make(dtype, tc.rhsDims...))
	product := tc.product(lhs, rhs)
	weights := graph.Parameter(g, "weights", product.Shape())
	loss := graph.ReduceAllSum(graph.Mul(product, weights))

	numProducts := 0
	for _, node := range g.Nodes() {
		if node.Type() == graph.NodeTypeDot || node.Type() == graph.NodeTypeDotGeneral {
			numProducts++
			_, handled := gemmGradients(node, []*graph.Node{graph.OnesLike(node)})
			require.True(t, handled, "gemm gradients fell back to GoMLX's for %s", node)
		}
	}
	require.Equal(t, 1, numProducts, "the case should build exactly one Dot or DotGeneral")

	var want, got []*graph.Node
	patch.With(false, func() { want = graph.Gradient(loss, lhs, rhs) })
	require.NotPanics(t, func() {
		patch.With(true, func() { got = graph.Gradient(loss, lhs, rhs) })
	})
	g.Compile(append(want, got...)...)
	outputs := g.Run(computetest.RandomTensor(rng, lhs.Shape()), computetest.RandomTensor(rng, rhs.Shape()),
		computetest.RandomTensor(rng, weights.Shape()))

	var worst float64
	for i, operand := range []string{"lhs", "rhs"} {
		require.True(t, outputs[i].Shape().Equal(outputs[i+2].Shape()), "%s gradient shapes", operand)
		worst = max(worst, maxRelativeError(flatFloat64(t, outputs[i]), flatFloat64(t, outputs[i+2])))
	}
	return worst
}

// TestDenseGradientHasNoBatchInOutIntermediate checks what the package is for: the gradient of a dense
// layer holds nothing of batch×in×out elements. Without Register it does (GoMLX's own VJP), which shows the
// test measures what it claims.
func TestDenseGradientHasNoBatchInOutIntermediate(t *testing.T) {
	const batch, in, out = 8, 6, 5
	layers := []struct {
		name      string
		inputDims []int
		dense     func(x, w *graph.Node) *graph.Node
	}{
		{"Dot[batch,in]×[in,out]", []int{batch, in}, graph.Dot},
		{"DotGeneral[2,batch/2,in]×[in,out]", []int{2, batch / 2, in}, func(x, w *graph.Node) *graph.Node {
			return graph.DotGeneral(x, []int{2}, nil, w, []int{0}, nil)
		}},
	}
	for _, layer := range layers {
		for _, registerGemm := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/gemm=%t", layer.name, registerGemm), func(t *testing.T) {
				g := graph.NewGraph(computetest.PureGo(t), "dense")
				defer g.Finalize()
				x := graph.Parameter(g, "x", shapes.Make(dtypes.Float32, layer.inputDims...))
				w := graph.Parameter(g, "w", shapes.Make(dtypes.Float32, in, out))
				loss := graph.ReduceAllSum(graph.Square(layer.dense(x, w)))
				patch.With(registerGemm, func() { _ = graph.Gradient(loss, x, w) })

				largest, node := largestNodeSize(g)
				if registerGemm {
					assert.Less(t, largest, batch*in*out, "largest node: %s", node)
				} else {
					assert.GreaterOrEqual(t, largest, batch*in*out,
						"GoMLX's own VJP no longer materialises batch×in×out: is this package still needed?")
				}
			})
		}
	}
}

func TestCheckCompatible(t *testing.T) {
	require.NoError(t, CheckCompatible(), "this GoMLX stores DotGeneral axes differently: gemmgrad must be updated")
}

func TestRegisterUnregister(t *testing.T) {
	funcPointer := func(vjp graph.VJP) uintptr { return reflect.ValueOf(vjp).Pointer() }
	patch.With(false, func() {
		shippedDot := graph.VJPRegistration[graph.NodeTypeDot]
		shippedDotGeneral := graph.VJPRegistration[graph.NodeTypeDotGeneral]
		require.False(t, Registered())

		Register()
		Register() // Idempotent: must not wrap our own VJP as the one to fall back on.
		require.True(t, Registered())
		assert.NotEqual(t, funcPointer(shippedDot), funcPointer(graph.VJPRegistration[graph.NodeTypeDot]))
		assert.NotEqual(t, funcPointer(shippedDotGeneral), funcPointer(graph.VJPRegistration[graph.NodeTypeDotGeneral]))
		assert.Equal(t, funcPointer(shippedDot), funcPointer(patch.Replaced(graph.NodeTypeDot)))
		assert.Equal(t, funcPointer(shippedDotGeneral), funcPointer(patch.Replaced(graph.NodeTypeDotGeneral)))

		Unregister()
		Unregister()
		require.False(t, Registered())
		assert.Equal(t, funcPointer(shippedDot), funcPointer(graph.VJPRegistration[graph.NodeTypeDot]))
		assert.Equal(t, funcPointer(shippedDotGeneral), funcPointer(graph.VJPRegistration[graph.NodeTypeDotGeneral]))
	})
}

func TestRegisterConcurrently(t *testing.T) {
	funcPointer := func(vjp graph.VJP) uintptr { return reflect.ValueOf(vjp).Pointer() }
	patch.With(false, func() {
		shippedDot := graph.VJPRegistration[graph.NodeTypeDot]
		done := make(chan struct{})
		for range 8 {
			go func() {
				defer func() { done <- struct{}{} }()
				Register()
				_ = Registered()
			}()
		}
		for range 8 {
			<-done
		}
		require.True(t, Registered())
		// A Register that ran twice would have remembered our own VJP as the one to restore.
		assert.Equal(t, funcPointer(shippedDot), funcPointer(patch.Replaced(graph.NodeTypeDot)))
		Unregister()
		assert.Equal(t, funcPointer(shippedDot), funcPointer(graph.VJPRegistration[graph.NodeTypeDot]))
	})
}

// TestFallsBackToGoMLX covers nodes the gemm gradients leave alone: the replaced VJP must get them.
func TestFallsBackToGoMLX(t *testing.T) {
	g := graph.NewGraph(computetest.PureGo(t), "fallback")
	defer g.Finalize()
	lhs := graph.Parameter(g, "lhs", shapes.Make(dtypes.Int32, 2, 3))
	rhs := graph.Parameter(g, "rhs", shapes.Make(dtypes.Int32, 3, 4))
	product := graph.Dot(lhs, rhs)
	_, handled := gemmGradients(product, []*graph.Node{graph.OnesLike(product)})
	assert.False(t, handled, "integer Dot")

	fallbackCalls := 0
	fallback := func(node *graph.Node, _ []*graph.Node, _ shapes.Shape) []*graph.Node {
		fallbackCalls++
		return []*graph.Node{nil, nil}
	}
	_ = gemmVJP(fallback)(product, []*graph.Node{graph.OnesLike(product)}, shapes.Make(dtypes.Int32))
	assert.Equal(t, 1, fallbackCalls)
}

// TestLayoutChangesFailLoudly checks that axes read from the wrong node, or contradicting the shapes, are
// reported rather than used.
func TestLayoutChangesFailLoudly(t *testing.T) {
	g := graph.NewGraph(computetest.PureGo(t), "layout")
	defer g.Finalize()
	x := graph.Parameter(g, "x", shapes.Make(dtypes.Float32, 2, 3))
	_, err := readDotGeneralAxes(graph.Add(x, x))
	require.Error(t, err, "an Add node's parameters must not read as DotGeneral axes")
	t.Logf("reading an Add node: %v", err)

	lhs, rhs := shapes.Make(dtypes.Float32, 2, 3), shapes.Make(dtypes.Float32, 3, 4)
	output := shapes.Make(dtypes.Float32, 2, 4)
	valid := dotAxes{lhsContracting: []int{1}, rhsContracting: []int{0}}
	require.NoError(t, valid.validate(lhs, rhs, output))
	for name, axes := range map[string]dotAxes{
		"swapped roles":   {lhsBatch: []int{1}, rhsBatch: []int{0}},
		"unpaired":        {lhsContracting: []int{1}},
		"out of range":    {lhsContracting: []int{2}, rhsContracting: []int{0}},
		"repeated":        {lhsContracting: []int{1, 1}, rhsContracting: []int{0, 0}},
		"dimensions":      {lhsContracting: []int{0}, rhsContracting: []int{0}},
		"wrong contracts": {lhsContracting: []int{1}, rhsContracting: []int{1}},
	} {
		assert.Error(t, axes.validate(lhs, rhs, output), name)
	}
}
