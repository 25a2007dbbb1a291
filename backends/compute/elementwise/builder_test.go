package elementwise

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends/compute/internal/computetest"
)

// TestScalarRewriteKeepsResults runs binary operations with a broadcast single value on either side, on the
// extended backend and on plain simplego: the results must be identical.
func TestScalarRewriteKeepsResults(t *testing.T) {
	ops := map[string]func(x, y *graph.Node) *graph.Node{
		"Add": graph.Add, "Sub": graph.Sub, "Mul": graph.Mul, "Div": graph.Div, "Max": graph.Max, "Min": graph.Min,
		"Pow":            graph.Pow,
		"GreaterOrEqual": func(x, y *graph.Node) *graph.Node { return graph.ConvertDType(graph.GreaterOrEqual(x, y), x.DType()) },
		"LessThan":       func(x, y *graph.Node) *graph.Node { return graph.ConvertDType(graph.LessThan(x, y), x.DType()) },
	}
	rng := rand.New(rand.NewPCG(15, 16))
	extended := Extend(computetest.PureGo(t))
	for name, op := range ops {
		for _, single := range []string{"right", "left"} {
			t.Run(fmt.Sprintf("%s/%s", name, single), func(t *testing.T) {
				x := computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, 5, 6))
				fn := func(x *graph.Node) *graph.Node {
					c := graph.BroadcastToShape(graph.Const(x.Graph(), float32(0.25)), x.Shape())
					if single == "left" {
						return op(c, graph.Abs(x))
					}
					return op(graph.Abs(x), c)
				}
				local, err := x.LocalClone()
				require.NoError(t, err)
				got := graph.MustExecOnce(extended, fn, local)
				want := graph.MustExecOnce(computetest.PureGo(t), fn, x)
				assert.Equal(t, want.Value(), got.Value())
			})
		}
	}
}

// TestScalarRewriteRecordsBroadcasts checks the builder takes a broadcast single value as a scalar.
func TestScalarRewriteRecordsBroadcasts(t *testing.T) {
	builder := Extend(computetest.PureGo(t)).Builder("records").(*scalarBuilder)
	x, err := builder.Parameter("x", shapes.Make(dtypes.Float32, 3, 4), nil)
	require.NoError(t, err)
	zero, err := builder.Constant([]float32{0}, 1)
	require.NoError(t, err)
	zeros, err := builder.BroadcastInDim(zero, shapes.Make(dtypes.Float32, 3, 4), []int{0})
	require.NoError(t, err)
	require.Contains(t, builder.singles, backends.Op(zeros))
	scalarShape, err := builder.OpShape(builder.singles[zeros])
	require.NoError(t, err)
	assert.Equal(t, 0, scalarShape.Rank())
	relu, err := builder.Max(x, zeros)
	require.NoError(t, err)
	reluShape, err := builder.OpShape(relu)
	require.NoError(t, err)
	assert.Equal(t, shapes.Make(dtypes.Float32, 3, 4), reluShape)
}
