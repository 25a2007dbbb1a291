package fusion

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
	"github.com/goaccel/goaccel/cpu/internal/elementwise"
)

func TestMain(m *testing.M) { computetest.Main(m) }

// backendsUnderTest returns the pure-Go backend with goaccel's element-wise executors, unfused, and the
// same backend fused: both run every element with the same float32 operations.
func backendsUnderTest(t testing.TB) (unfused, fused backends.Backend) {
	t.Helper()
	require.NoError(t, elementwise.Install())
	require.NoError(t, Install())
	unfused = elementwise.Extend(computetest.PureGo(t))
	return unfused, Extend(unfused)
}

// sameValues compares tensors' float32 values bit for bit (any NaN matches any NaN).
func sameValues(t *testing.T, want, got *tensors.Tensor, format string, args ...any) {
	t.Helper()
	w, g := tensors.MustCopyFlatData[float32](want), tensors.MustCopyFlatData[float32](got)
	require.Equal(t, len(w), len(g), fmt.Sprintf(format, args...))
	for i := range w {
		if w[i] != w[i] && g[i] != g[i] {
			continue
		}
		if math.Float32bits(w[i]) != math.Float32bits(g[i]) {
			assert.Failf(t, "fused result differs", "%s: element %d of %d: unfused %g, fused %g",
				fmt.Sprintf(format, args...), i, len(w), w[i], g[i])
			return
		}
	}
}

// withSpecials sets a few elements to NaN, ±Inf and ±0.
func withSpecials(x *tensors.Tensor) *tensors.Tensor {
	tensors.MustMutableFlatData[float32](x, func(flat []float32) {
		specials := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0,
			float32(math.Copysign(0, -1))}
		for i, v := range specials {
			if j := 7 * i; j < len(flat) {
				flat[j] = v
			}
		}
	})
	return x
}

type fusionCase struct {
	name   string
	shapes []shapes.Shape
	fn     func(inputs []*graph.Node) []*graph.Node
	// chains is how many fused nodes the graph must have (-1: do not check).
	chains int
}

func f32(dims ...int) shapes.Shape { return shapes.Make(dtypes.Float32, dims...) }

var cases = []fusionCase{
	{name: "GELU", shapes: []shapes.Shape{f32(33, 70)}, chains: 1, fn: func(x []*graph.Node) []*graph.Node {
		// GoMLX's exact GELU: x·(1 + erf(x/√2))/2.
		return []*graph.Node{graph.MulScalar(graph.Mul(x[0], graph.OnePlus(graph.Erf(graph.MulScalar(x[0], 1/math.Sqrt2)))), 0.5)}
	}},
	{name: "ReLU gradient", shapes: []shapes.Shape{f32(64, 28, 28, 16), f32(64, 28, 28, 16)}, chains: 1,
		fn: func(x []*graph.Node) []*graph.Node {
			positive := graph.ConvertDType(graph.GreaterOrEqual(x[0], graph.ZerosLike(x[0])), dtypes.Float32)
			return []*graph.Node{graph.Mul(x[1], positive)}
		}},
	{name: "bias and ReLU, channels last", shapes: []shapes.Shape{f32(8, 5, 5, 16), f32(16)}, chains: 1,
		fn: func(x []*graph.Node) []*graph.Node {
			bias := graph.Reshape(x[1], 1, 1, 1, 16)
			return []*graph.Node{graph.Max(graph.Add(x[0], graph.BroadcastToShape(bias, x[0].Shape())), graph.ZerosLike(x[0]))}
		}},
	{name: "per-row scale", shapes: []shapes.Shape{f32(37, 129), f32(37, 1)}, chains: 1,
		fn: func(x []*graph.Node) []*graph.Node {
			return []*graph.Node{graph.Exp(graph.Sub(x[0], graph.BroadcastToShape(x[1], x[0].Shape())))}
		}},
	{name: "bias, channels first", shapes: []shapes.Shape{f32(3, 7, 9, 11), f32(1, 7, 1, 1)}, chains: 1,
		fn: func(x []*graph.Node) []*graph.Node {
			return []*graph.Node{graph.Abs(graph.Div(graph.BroadcastToShape(x[1], x[0].Shape()), x[0]))}
		}},
	{name: "Adam", shapes: []shapes.Shape{f32(100, 60), f32(100, 60), f32(100, 60), f32(100, 60), f32()}, chains: 3,
		fn: func(x []*graph.Node) []*graph.Node {
			param, m, v, grad, lr := x[0], x[1], x[2], x[3], x[4]
			m1 := graph.Add(graph.MulScalar(m, 0.9), graph.MulScalar(grad, 0.1))
			v1 := graph.Add(graph.MulScalar(v, 0.999), graph.MulScalar(graph.Square(grad), 0.001))
			step := graph.Div(m1, graph.AddScalar(graph.Sqrt(v1), 1e-8))
			return []*graph.Node{graph.Sub(param, graph.Mul(step, graph.BroadcastToShape(lr, param.Shape()))), m1, v1}
		}},
	{name: "Where", shapes: []shapes.Shape{f32(300), f32(300)}, chains: 1, fn: func(x []*graph.Node) []*graph.Node {
		return []*graph.Node{graph.Where(graph.GreaterThan(x[0], x[1]), graph.MulScalar(x[0], 2), graph.Neg(x[1]))}
	}},
	{name: "Where with a scalar", shapes: []shapes.Shape{f32(300), f32(300)}, chains: 1, fn: func(x []*graph.Node) []*graph.Node {
		zero := graph.BroadcastToShape(graph.Const(x[0].Graph(), float32(0)), x[0].Shape())
		return []*graph.Node{graph.Where(graph.LessOrEqual(x[0], x[1]), x[0], zero)}
	}},
	{name: "operations on a broadcast scalar", shapes: []shapes.Shape{f32(), f32(), f32(64)}, chains: -1,
		fn: func(x []*graph.Node) []*graph.Node {
			// A mean's gradient is a scalar spread over the input's shape: unary and binary operations of
			// such scalars alone run on a register holding it.
			spread := func(v *graph.Node) *graph.Node { return graph.BroadcastToShape(v, x[2].Shape()) }
			negated := graph.Neg(spread(x[0]))
			sum := graph.Add(spread(x[0]), spread(x[1]))
			return []*graph.Node{negated, graph.Exp(sum), graph.Mul(graph.Sqrt(graph.Abs(spread(x[1]))), x[2])}
		}},
	{name: "Identity nodes are the value itself", shapes: []shapes.Shape{f32(30, 20)}, chains: 1,
		fn: func(x []*graph.Node) []*graph.Node {
			// StopGradient and IdentityWithCustomGradient are Identity nodes of the backend: x·2 + (x − x)
			// through them is one chain, where simplego would copy x (read elsewhere) for each.
			through := graph.IdentityWithCustomGradient(x[0], func(_, v *graph.Node) *graph.Node { return v })
			zero := graph.Sub(through, graph.StopGradient(x[0]))
			return []*graph.Node{graph.Add(graph.StopGradient(graph.MulScalar(x[0], 2)), zero)}
		}},
	{name: "a value read twice stays a node", shapes: []shapes.Shape{f32(40, 40)}, chains: 3,
		fn: func(x []*graph.Node) []*graph.Node {
			e := graph.Exp(graph.Neg(x[0]))
			return []*graph.Node{graph.MulScalar(e, 2), graph.AddScalar(e, 1)}
		}},
	{name: "an output read by another", shapes: []shapes.Shape{f32(20, 50), f32(20, 50)}, chains: 2,
		fn: func(x []*graph.Node) []*graph.Node {
			a := graph.Mul(x[0], x[1])
			return []*graph.Node{a, graph.Sqrt(graph.Abs(graph.AddScalar(a, 1)))}
		}},
	{name: "softmax", shapes: []shapes.Shape{f32(16, 4, 64, 64)}, chains: -1, fn: func(x []*graph.Node) []*graph.Node {
		return []*graph.Node{graph.Softmax(x[0], -1)}
	}},
	{name: "causal mask", shapes: []shapes.Shape{f32(2, 3, 64, 64)}, chains: -1, fn: func(x []*graph.Node) []*graph.Node {
		// A [64, 64] mask broadcast over batch and heads, as attention builds it: fused nodes read the mask
		// and the masking value through their broadcasts.
		g := x[0].Graph()
		causal := graph.GreaterOrEqual(graph.Iota(g, shapes.Make(dtypes.Int32, 64, 64), 0),
			graph.Iota(g, shapes.Make(dtypes.Int32, 64, 64), 1))
		mask := graph.BroadcastToShape(graph.Reshape(causal, 1, 1, 64, 64), shapes.Make(dtypes.Bool, 2, 3, 64, 64))
		lowest := graph.BroadcastToShape(graph.Const(g, float32(-math.MaxFloat32)), x[0].Shape())
		return []*graph.Node{graph.Exp(graph.Where(mask, graph.MulScalar(x[0], 0.125), lowest))}
	}},
	// Large enough for its tiles to be split over threads (parallelElements), with a broadcast leaf, a
	// scalar and a boolean: every worker fills its own registers.
	{name: "split over threads", shapes: []shapes.Shape{f32(64, 33, 40), f32(40)}, chains: -1, fn: func(x []*graph.Node) []*graph.Node {
		positive := graph.GreaterThan(x[0], graph.ZerosLike(x[0]))
		return []*graph.Node{graph.Where(positive, graph.Mul(graph.AddScalar(x[0], 0.5), graph.BroadcastToDims(graph.Reshape(x[1], 1, 1, 40), 64, 33, 40)), graph.Exp(x[0]))}
	}},
	{name: "boolean input", shapes: []shapes.Shape{f32(50, 50), f32(50, 50)}, chains: -1, fn: func(x []*graph.Node) []*graph.Node {
		mask := graph.LessThan(x[0], x[1]) // read twice: a boolean leaf of both chains
		return []*graph.Node{graph.Mul(graph.ConvertDType(mask, dtypes.Float32), x[0]),
			graph.Where(mask, graph.Exp(x[1]), x[0])}
	}},
}

// TestFusedMatchesUnfused runs model-shaped element-wise chains fused and unfused: bit for bit the same,
// NaN, infinities and signed zeros included, with the number of fused nodes each graph should have.
func TestFusedMatchesUnfused(t *testing.T) {
	unfused, fused := backendsUnderTest(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var inputs []*tensors.Tensor
			for _, s := range tc.shapes {
				inputs = append(inputs, withSpecials(computetest.RandomTensor(rng, s)))
			}
			run := func(backend backends.Backend) []*tensors.Tensor {
				exec := graph.MustNewExec(backend, tc.fn)
				var args []any
				for _, x := range inputs {
					local, err := x.LocalClone()
					require.NoError(t, err)
					args = append(args, local)
				}
				return exec.MustExec(args...)
			}
			want := run(unfused)
			before := Calls()
			got := run(fused)
			after := Calls()
			require.Len(t, got, len(want))
			for i := range want {
				sameValues(t, want[i], got[i], "output %d", i)
			}
			if tc.chains >= 0 {
				assert.Equal(t, uint64(tc.chains), after.Chains-before.Chains, "fused nodes")
			}
			// A softmax runs as a row kernel (rows_test.go), the rest as fused chains.
			assert.Positive(t, after.Runs+after.RowRuns-before.Runs-before.RowRuns, "fused nodes that ran")
		})
	}
}

// TestFusionSkipsIntermediates checks that a fused chain's intermediate nodes do not run: a GELU of six
// operations is one fused node, run once per execution.
func TestFusionSkipsIntermediates(t *testing.T) {
	_, fused := backendsUnderTest(t)
	exec := graph.MustNewExec(fused, cases[0].fn)
	x := computetest.RandomTensor(rand.New(rand.NewPCG(3, 4)), f32(33, 70))
	exec.MustExec(x)
	before := Calls()
	exec.MustExec(x)
	exec.MustExec(x)
	after := Calls()
	assert.Equal(t, uint64(2), after.Runs-before.Runs, "one fused node per execution")
}

// TestRandomChains fuzzes the pass with random graphs of element-wise operations over three inputs, some of
// them broadcast, with values read once or several times and several outputs, against the unfused graph.
func TestRandomChains(t *testing.T) {
	unfused, fused := backendsUnderTest(t)
	rng := rand.New(rand.NewPCG(5, 6))
	for round := range 150 {
		seed := rng.Uint64()
		dims := []int{1 + rng.IntN(9), 1 + rng.IntN(300)}
		fn := randomGraph(seed, dims)
		inputs := []*tensors.Tensor{
			withSpecials(computetest.RandomTensor(rng, f32(dims...))),
			computetest.RandomTensor(rng, f32(dims...)),
			computetest.RandomTensor(rng, f32(1, dims[1])),
		}
		run := func(backend backends.Backend) []*tensors.Tensor {
			var args []any
			for _, x := range inputs {
				local, err := x.LocalClone()
				require.NoError(t, err)
				args = append(args, local)
			}
			return graph.MustNewExec(backend, fn).MustExec(args...)
		}
		want, got := run(unfused), run(fused)
		require.Len(t, got, len(want))
		for i := range want {
			sameValues(t, want[i], got[i], "round %d (seed %d, dims %v), output %d", round, seed, dims, i)
		}
	}
}

// randomGraph returns a graph function of three inputs (x, y: dims; b: [1, dims[1]], broadcast) built from
// 4 to 20 random element-wise operations.
func randomGraph(seed uint64, dims []int) func(x, y, b *graph.Node) []*graph.Node {
	return func(x, y, b *graph.Node) []*graph.Node {
		rng := rand.New(rand.NewPCG(seed, 7))
		values := []*graph.Node{x, y, graph.BroadcastToShape(b, x.Shape())}
		pick := func() *graph.Node { return values[rng.IntN(len(values))] }
		for range 4 + rng.IntN(17) {
			a, c := pick(), pick()
			var v *graph.Node
			switch rng.IntN(13) {
			case 0:
				v = graph.Add(a, c)
			case 1:
				v = graph.Sub(a, c)
			case 2:
				v = graph.Mul(a, c)
			case 3:
				v = graph.Div(a, graph.AddScalar(graph.Abs(c), 1))
			case 4:
				v = graph.Max(a, c)
			case 5:
				v = graph.Min(a, graph.ZerosLike(a))
			case 6:
				v = graph.Neg(a)
			case 7:
				v = graph.Sqrt(graph.Abs(a))
			case 8:
				v = graph.Exp(graph.MinScalar(a, 10))
			case 9:
				v = graph.Erf(a)
			case 10:
				v = graph.ConvertDType(graph.GreaterOrEqual(a, c), dtypes.Float32)
			case 11:
				v = graph.Where(graph.LessThan(a, c), a, graph.MulScalar(c, 3))
			default:
				v = graph.AddScalar(graph.MulScalar(a, 0.5), 0.25)
			}
			values = append(values, v)
		}
		// The last value, and one or two others at random (possibly read by later values too).
		outputs := []*graph.Node{values[len(values)-1]}
		for range rng.IntN(3) {
			if v := values[3+rng.IntN(len(values)-3)]; v != outputs[0] && (len(outputs) < 2 || v != outputs[1]) {
				outputs = append(outputs, v)
			}
		}
		return outputs
	}
}

// TestFusedNodesReadBroadcastSources: a fused node reads a broadcast's source with its pattern, so the
// broadcast (of a mask, of per-row statistics) is never materialised.
func TestFusedNodesReadBroadcastSources(t *testing.T) {
	_, fused := backendsUnderTest(t)
	rng := rand.New(rand.NewPCG(7, 8))
	x := computetest.RandomTensor(rng, f32(6, 4, 128))
	exec := graph.MustNewExec(fused, func(x *graph.Node) *graph.Node {
		mean := graph.ReduceAndKeep(x, graph.ReduceMean, -1)
		keep := graph.BroadcastToShape(graph.Reshape(graph.GreaterThan(mean, graph.ZerosLike(mean)), 6, 4, 1),
			x.Shape())
		return graph.Where(keep, graph.Sub(x, graph.BroadcastToShape(mean, x.Shape())), x)
	})
	exec.MustExec(x)
	before := elementwise.Calls().BroadcastInDims
	exec.MustExec(x)
	assert.Equal(t, before, elementwise.Calls().BroadcastInDims, "a broadcast ran")
}

// TestFusedNodesAreNotIdentities: a fused node is an Identity node of simplego carrying its program; a
// backend extended twice fuses the graph twice, and the second pass must not take a fused node of one
// input for a plain Identity (the value of its input).
func TestFusedNodesAreNotIdentities(t *testing.T) {
	unfused, fused := backendsUnderTest(t)
	twice := Extend(fused)
	x := computetest.RandomTensor(rand.New(rand.NewPCG(4, 4)), f32(25, 40))
	chain := func(x *graph.Node) *graph.Node { return graph.Sqrt(graph.Exp(graph.Neg(x))) } // x its only input
	local := func() *tensors.Tensor {
		clone, err := x.LocalClone()
		require.NoError(t, err)
		return clone
	}
	want := graph.MustExecOnce(unfused, chain, local())
	got := graph.MustExecOnce(twice, chain, local())
	sameValues(t, want, got, "a chain of one input, fused by a backend extended twice")
}
