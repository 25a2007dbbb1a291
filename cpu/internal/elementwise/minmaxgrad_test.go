package elementwise

import (
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
)

// TestMinMaxGradientsMatchGoMLX compares the registered gradients of Max, Min and ReLU with GoMLX's own on
// inputs with ties, in float32 and float64: they must be identical.
func TestMinMaxGradientsMatchGoMLX(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	ops := map[string]func(x, y *graph.Node) *graph.Node{
		"max":  graph.Max,
		"min":  graph.Min,
		"relu": func(x, _ *graph.Node) *graph.Node { return graph.Max(x, graph.ZerosLike(x)) },
	}
	for name, op := range ops {
		for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64} {
			t.Run(name+"/"+dtype.String(), func(t *testing.T) {
				x := computetest.RandomTensor(rng, shapes.Make(dtype, 7, 5))
				y := computetest.RandomTensor(rng, shapes.Make(dtype, 7, 5))
				// Ties: make some of y's elements equal x's (and ReLU gets exact zeros).
				x, y = withTies(t, x, y), withTies(t, y, x)
				gradients := func(x, y *graph.Node) []*graph.Node {
					out := op(x, y)
					weights := graph.Cos(graph.MulScalar(graph.IotaFull(x.Graph(), out.Shape()), 0.7))
					return graph.Gradient(graph.ReduceAllSum(graph.Mul(out, weights)), x, y)
				}
				backend := computetest.PureGo(t)
				RegisterGradients()
				got := graph.MustExecOnceN(backend, gradients, x, y)
				UnregisterGradients()
				want := graph.MustExecOnceN(backend, gradients, x, y)
				for i := range want {
					assert.Equal(t, want[i].Value(), got[i].Value(), "gradient %d", i)
				}
			})
		}
	}
}

// withTies returns a copy of a whose every third element is b's, and every fifth zero.
func withTies(t *testing.T, a, b *tensors.Tensor) *tensors.Tensor {
	t.Helper()
	out, err := a.LocalClone()
	require.NoError(t, err)
	bValues := flatOf(b)
	switch a.DType() {
	case dtypes.Float32:
		tensors.MustMutableFlatData[float32](out, func(flat []float32) {
			for i := range flat {
				if i%3 == 0 {
					flat[i] = float32(bValues[i])
				} else if i%5 == 0 {
					flat[i] = 0
				}
			}
		})
	default:
		tensors.MustMutableFlatData[float64](out, func(flat []float64) {
			for i := range flat {
				if i%3 == 0 {
					flat[i] = bValues[i]
				} else if i%5 == 0 {
					flat[i] = 0
				}
			}
		})
	}
	return out
}

func flatOf(t *tensors.Tensor) []float64 {
	if t.DType() == dtypes.Float32 {
		values := tensors.MustCopyFlatData[float32](t)
		out := make([]float64, len(values))
		for i, v := range values {
			out[i] = float64(v)
		}
		return out
	}
	return tensors.MustCopyFlatData[float64](t)
}
