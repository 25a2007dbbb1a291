package elementwise

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
)

// execBoth runs fn on x with this package's executors and with simplego's, and returns both results.
func execBoth(t *testing.T, fn func(x *graph.Node) *graph.Node, x *tensors.Tensor) (got, want any) {
	t.Helper()
	require.NoError(t, Install())
	local, err := x.LocalClone()
	require.NoError(t, err)
	got = graph.MustExecOnce(computetest.PureGo(t), fn, local).Value()
	Uninstall()
	local, err = x.LocalClone()
	require.NoError(t, err)
	want = graph.MustExecOnce(computetest.PureGo(t), fn, local).Value()
	return got, want
}

// TestTransposesMatchSimplego permutes random tensors of several dtypes every possible way.
func TestTransposesMatchSimplego(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	dims := []int{3, 1, 4, 5}
	permutations := [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {0, 2, 1, 3}, {0, 2, 3, 1}, {1, 0, 3, 2}, {2, 3, 0, 1}}
	for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64, dtypes.Int32, dtypes.Bool} {
		for _, permutation := range permutations {
			t.Run(fmt.Sprintf("%s/%v", dtype, permutation), func(t *testing.T) {
				x := randomOf(rng, dtype, dims)
				before := Calls().Transposes
				got, want := execBoth(t, func(x *graph.Node) *graph.Node { return graph.TransposeAllDims(x, permutation...) }, x)
				assert.Equal(t, want, got)
				if !isIdentity(permutation) {
					assert.Equal(t, before+1, Calls().Transposes)
				}
			})
		}
	}
}

// TestBroadcastInDimsMatchSimplego broadcasts along leading, inner, trailing and scattered axes.
func TestBroadcastInDimsMatchSimplego(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	cases := []struct {
		from, to, axes []int
	}{
		{[]int{4}, []int{3, 4}, []int{1}},
		{[]int{3}, []int{3, 4}, []int{0}},
		{[]int{3, 1}, []int{3, 5, 4}, []int{0, 2}},
		{[]int{2, 5}, []int{2, 3, 5, 4}, []int{0, 2}},
		{[]int{1}, []int{6, 2}, []int{1}},
		{[]int{5, 4}, []int{3, 5, 4}, []int{1, 2}},
	}
	for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Int32, dtypes.Bool} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/%v->%v/%v", dtype, c.from, c.to, c.axes), func(t *testing.T) {
				x := randomOf(rng, dtype, c.from)
				before := Calls().BroadcastInDims
				got, want := execBoth(t, func(x *graph.Node) *graph.Node {
					// An op on x first: a broadcast of a parameter would still be one, but of a computed value
					// is what models have.
					var expanded []int // The output axes not taken from x.
					for axis := range c.to {
						if !slices.Contains(c.axes, axis) {
							expanded = append(expanded, axis)
						}
					}
					return graph.ExpandAndBroadcast(graph.Identity(x), c.to, expanded)
				}, x)
				assert.Equal(t, want, got)
				assert.Equal(t, before+1, Calls().BroadcastInDims)
			})
		}
	}
}

func isIdentity(permutation []int) bool {
	for i, axis := range permutation {
		if i != axis {
			return false
		}
	}
	return true
}

func randomOf(rng *rand.Rand, dtype dtypes.DType, dims []int) *tensors.Tensor {
	switch dtype {
	case dtypes.Int32:
		values := make([]int32, shapes.Make(dtype, dims...).Size())
		for i := range values {
			values[i] = rng.Int32N(1000)
		}
		return tensors.FromFlatDataAndDimensions(values, dims...)
	case dtypes.Bool:
		values := make([]bool, shapes.Make(dtype, dims...).Size())
		for i := range values {
			values[i] = rng.IntN(2) == 0
		}
		return tensors.FromFlatDataAndDimensions(values, dims...)
	default:
		return computetest.RandomTensor(rng, shapes.Make(dtype, dims...))
	}
}
