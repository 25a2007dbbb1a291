package convgraph

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
)

// pureGoLowered is the shared pure-Go backend with convolutions and poolings lowered (LowerConvolutions).
var pureGoLowered = sync.OnceValue(func() backends.Backend {
	backend, err := computetest.Backend()
	if err != nil {
		panic(err)
	}
	return LowerConvolutions(backend)
})

// evaluate runs fn on local copies of inputs on backend.
func evaluate(t *testing.T, backend backends.Backend, fn func(inputs []*graph.Node) *graph.Node,
	inputs []*tensors.Tensor) *tensors.Tensor {
	t.Helper()
	exec, err := graph.NewExecAny(backend, fn)
	require.NoError(t, err)
	defer exec.Finalize()
	args := make([]any, len(inputs))
	for i, input := range inputs {
		args[i], err = input.LocalClone()
		require.NoError(t, err)
	}
	outputs, err := exec.Exec(args...)
	require.NoError(t, err)
	return outputs[0]
}

// TestLoweredConvolutionsMatchPureGo compares convolutions lowered to im2col with the pure-Go backend's own
// ConvGeneral, including configurations the lowering leaves to it (grouping, input dilation).
func TestLoweredConvolutionsMatchPureGo(t *testing.T) {
	type testCase struct {
		name          string
		input, kernel shapes.Shape
		convolve      func(x, kernel *graph.Node) *graph.Node
		// reference, if set, is convolve as the pure-Go backend runs it: with kernel dilations spelled out,
		// without which its grouped and input-dilated convolutions crash.
		reference func(x, kernel *graph.Node) *graph.Node
	}
	cases := make([]testCase, 0, len(convCases)+2)
	for _, c := range convCases {
		inputShape, kernelShape := c.shapes()
		cases = append(cases, testCase{name: c.name, input: inputShape, kernel: kernelShape, convolve: c.convolve})
	}
	cases = append(cases,
		testCase{
			name: "channel-groups", input: shapes.Make(dtypes.Float64, 2, 5, 5, 4), kernel: shapes.Make(dtypes.Float64, 3, 3, 2, 4),
			convolve: func(x, kernel *graph.Node) *graph.Node {
				return graph.Convolve(x, kernel).Strides(1).ChannelGroupCount(2).Done()
			},
			reference: func(x, kernel *graph.Node) *graph.Node {
				return graph.Convolve(x, kernel).Strides(1).ChannelGroupCount(2).DilationPerAxis(1, 1).Done()
			},
		},
		testCase{
			name: "input-dilation", input: shapes.Make(dtypes.Float64, 2, 4, 5, 3), kernel: shapes.Make(dtypes.Float64, 3, 3, 3, 2),
			convolve: func(x, kernel *graph.Node) *graph.Node {
				return graph.Convolve(x, kernel).Strides(1).InputDilationPerAxis(2, 2).Done()
			},
			reference: func(x, kernel *graph.Node) *graph.Node {
				return graph.Convolve(x, kernel).Strides(1).InputDilationPerAxis(2, 2).DilationPerAxis(1, 1).Done()
			},
		},
		testCase{
			name: "float32/stride1/same", input: shapes.Make(dtypes.Float32, 3, 8, 8, 2), kernel: shapes.Make(dtypes.Float32, 3, 3, 2, 5),
			convolve: func(x, kernel *graph.Node) *graph.Node { return graph.Convolve(x, kernel).Strides(1).PadSame().Done() },
		},
	)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 4))
			inputs := []*tensors.Tensor{computetest.RandomTensor(rng, c.input), computetest.RandomTensor(rng, c.kernel)}
			fn := func(nodes []*graph.Node) *graph.Node { return c.convolve(nodes[0], nodes[1]) }
			reference := fn
			if c.reference != nil {
				reference = func(nodes []*graph.Node) *graph.Node { return c.reference(nodes[0], nodes[1]) }
			}
			want := evaluate(t, computetest.PureGo(t), reference, inputs)
			got := evaluate(t, pureGoLowered(), fn, inputs)
			require.True(t, want.Shape().Equal(got.Shape()), "shape %s, want %s", got.Shape(), want.Shape())
			if c.input.DType == dtypes.Float32 {
				require.InDeltaSlice(t, tensors.MustCopyFlatData[float32](want), tensors.MustCopyFlatData[float32](got), 1e-5)
			} else {
				require.InDeltaSlice(t, tensors.MustCopyFlatData[float64](want), tensors.MustCopyFlatData[float64](got), 1e-12)
			}
		})
	}
}

// TestLoweredConvGradientsMatchFiniteDifferences checks gradients through the lowered forward pass.
func TestLoweredConvGradientsMatchFiniteDifferences(t *testing.T) {
	checkConvGradients(t, pureGoLowered(), 5)
}

// TestLoweredPoolingsMatchPureGo compares poolings on the lowering backend with the pure-Go backend's own
// ReduceWindow, lowered (non-overlapping windows) or not.
func TestLoweredPoolingsMatchPureGo(t *testing.T) {
	for i, c := range poolCases {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 6))
			inputs := []*tensors.Tensor{computetest.RandomTensor(rng, shapes.Make(dtypes.Float64, c.input...))}
			fn := func(nodes []*graph.Node) *graph.Node { return c.apply(nodes[0]) }
			want := evaluate(t, computetest.PureGo(t), fn, inputs)
			got := evaluate(t, pureGoLowered(), fn, inputs)
			require.True(t, want.Shape().Equal(got.Shape()), "shape %s, want %s", got.Shape(), want.Shape())
			require.InDeltaSlice(t, tensors.MustCopyFlatData[float64](want), tensors.MustCopyFlatData[float64](got), 1e-12)
		})
	}
}

// countingBackend counts the DotGeneral and Reduce{Max,Min,Sum} ops its builders build, to tell whether
// LowerConvolutions lowered an op or kept the inner one.
type countingBackend struct {
	backends.Backend
	dots, reductions *int
}

func (b countingBackend) Builder(name string) backends.Builder {
	return countingBuilder{b.Backend.Builder(name), b.dots, b.reductions}
}

type countingBuilder struct {
	backends.Builder
	dots, reductions *int
}

func (b countingBuilder) DotGeneral(lhs backends.Op, lhsContracting, lhsBatch []int, rhs backends.Op,
	rhsContracting, rhsBatch []int) (backends.Op, error) {
	*b.dots++
	return b.Builder.DotGeneral(lhs, lhsContracting, lhsBatch, rhs, rhsContracting, rhsBatch)
}

func (b countingBuilder) ReduceMax(x backends.Op, axes ...int) (backends.Op, error) {
	*b.reductions++
	return b.Builder.ReduceMax(x, axes...)
}

func (b countingBuilder) ReduceMin(x backends.Op, axes ...int) (backends.Op, error) {
	*b.reductions++
	return b.Builder.ReduceMin(x, axes...)
}

func (b countingBuilder) ReduceSum(x backends.Op, axes ...int) (backends.Op, error) {
	*b.reductions++
	return b.Builder.ReduceSum(x, axes...)
}

// TestLowerConvolutionsLowersWhatItSupports checks, by counting the ops built, which convolutions and poolings
// are lowered and which keep the inner backend's op.
func TestLowerConvolutionsLowersWhatItSupports(t *testing.T) {
	for _, c := range []struct {
		name           string
		input          shapes.Shape
		build          func(x *graph.Node) *graph.Node
		wantDots       int
		wantReductions int
	}{
		{"conv/stride2/same", shapes.Make(dtypes.Float32, 2, 8, 8, 3), func(x *graph.Node) *graph.Node {
			kernel := graph.IotaFull(x.Graph(), shapes.Make(dtypes.Float32, 3, 3, 3, 4))
			return graph.Convolve(x, kernel).Strides(2).PadSame().Done()
		}, 1, 0},
		{"conv/channel-groups", shapes.Make(dtypes.Float32, 2, 8, 8, 4), func(x *graph.Node) *graph.Node {
			kernel := graph.IotaFull(x.Graph(), shapes.Make(dtypes.Float32, 3, 3, 2, 4))
			return graph.Convolve(x, kernel).Strides(1).ChannelGroupCount(2).Done()
		}, 0, 0},
		{"maxpool/2x2", shapes.Make(dtypes.Float32, 2, 8, 8, 3), func(x *graph.Node) *graph.Node {
			return graph.MaxPool(x).Window(2).Done()
		}, 0, 1},
		{"meanpool/2x2/padded", shapes.Make(dtypes.Float32, 2, 7, 7, 3), func(x *graph.Node) *graph.Node {
			return graph.MeanPool(x).Window(2).PaddingPerDim([][2]int{{1, 0}, {0, 1}}).Done()
		}, 0, 2}, // The sum, and the count of the window's elements that are not padding.
		{"maxpool/3x3/stride2", shapes.Make(dtypes.Float32, 2, 8, 8, 3), func(x *graph.Node) *graph.Node {
			return graph.MaxPool(x).Window(3).Strides(2).Done()
		}, 0, 0},
		{"maxpool/int32", shapes.Make(dtypes.Int32, 2, 8, 8, 3), func(x *graph.Node) *graph.Node {
			return graph.MaxPool(x).Window(2).Done()
		}, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var dots, reductions int
			backend := LowerConvolutions(countingBackend{computetest.PureGo(t), &dots, &reductions})
			g := graph.NewGraph(backend, "lowering")
			defer g.Finalize()
			c.build(graph.Parameter(g, "x", c.input))
			require.Equal(t, c.wantDots, dots, "DotGenerals built")
			require.Equal(t, c.wantReductions, reductions, "reductions built")
		})
	}
}
