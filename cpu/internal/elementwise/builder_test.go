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

	"github.com/goaccel/goaccel/cpu/internal/computetest"
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

// TestExpansionRewrite runs binary operations whose operand is a broadcast inserting axes, on the extended
// backend with the executors installed and on plain simplego: the results must be identical, the extended
// backend must not execute the broadcast, and a broadcast the executors cannot loop over (one with a hole)
// must still be executed.
func TestExpansionRewrite(t *testing.T) {
	ops := map[string]func(x, y *graph.Node) *graph.Node{
		"Add": graph.Add, "Sub": graph.Sub, "Mul": graph.Mul, "Div": graph.Div, "Max": graph.Max, "Min": graph.Min,
	}
	tests := []struct {
		name       string
		smallDims  []int
		expanded   []int // axes of [4, 5, 6] the broadcast inserts (none: a same-rank broadcast of 1s)
		rewritten  bool
		smallOnLHS bool
	}{
		{"per position (layer norm)", []int{4, 5, 1}, nil, true, false},
		{"per position, inserted axis", []int{4, 5}, []int{2}, true, false},
		{"per position, on the left", []int{4, 5}, []int{2}, true, true},
		{"per feature (bias)", []int{6}, []int{0, 1}, true, false},
		{"per example", []int{4}, []int{1, 2}, true, true},
		{"with a hole", []int{4, 6}, []int{1}, false, false},
	}
	rng := rand.New(rand.NewPCG(17, 18))
	require.NoError(t, Install())
	t.Cleanup(Uninstall)
	extended := Extend(computetest.PureGo(t))
	for _, tc := range tests {
		for name, op := range ops {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				x := computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, 4, 5, 6))
				small := computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, tc.smallDims...))
				fn := func(x, small *graph.Node) *graph.Node {
					shifted := graph.Add(small, graph.Const(small.Graph(), float32(2)))
					var spread *graph.Node
					if tc.expanded != nil {
						spread = graph.ExpandAndBroadcast(shifted, x.Shape().Dimensions, tc.expanded)
					} else {
						spread = graph.BroadcastToShape(shifted, x.Shape())
					}
					if tc.smallOnLHS {
						return op(spread, x)
					}
					return op(x, spread)
				}
				want := graph.MustExecOnce(computetest.PureGo(t), fn, x, small)
				localX, err := x.LocalClone()
				require.NoError(t, err)
				localSmall, err := small.LocalClone()
				require.NoError(t, err)
				before := Calls()
				got := graph.MustExecOnce(extended, fn, localX, localSmall)
				after := Calls()
				assert.Equal(t, want.Value(), got.Value())
				if tc.rewritten {
					assert.Equal(t, before.BroadcastInDims, after.BroadcastInDims, "the broadcast was executed")
					assert.Equal(t, before.Broadcasts+1, after.Broadcasts, "the broadcasting executor did not run")
				} else {
					assert.Greater(t, after.BroadcastInDims, before.BroadcastInDims, "the broadcast must be executed")
				}
			})
		}
	}
}

// TestExpansionRecordsOnlyInsertions: a broadcast that reorders axes is not a reshape and is not recorded.
func TestExpansionRecordsOnlyInsertions(t *testing.T) {
	builder := Extend(computetest.PureGo(t)).Builder("expansions").(*scalarBuilder)
	x, err := builder.Parameter("x", shapes.Make(dtypes.Float32, 3, 4), nil)
	require.NoError(t, err)
	inserted, err := builder.BroadcastInDim(x, shapes.Make(dtypes.Float32, 3, 2, 4), []int{0, 2})
	require.NoError(t, err)
	transposed, err := builder.BroadcastInDim(x, shapes.Make(dtypes.Float32, 4, 2, 3), []int{2, 0})
	require.NoError(t, err)
	require.Contains(t, builder.expansions, backends.Op(inserted))
	assert.Equal(t, []int{3, 1, 4}, builder.expansions[inserted].sourceDims)
	assert.NotContains(t, builder.expansions, backends.Op(transposed))
}
