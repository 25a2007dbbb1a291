package indexing

import (
	"math"
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

func TestMain(m *testing.M) { computetest.Main(m) }

// indicesTensor returns int32 or int64 indices of the given dims (the last one 1), drawn in [lo, hi).
func indicesTensor(rng *rand.Rand, dtype dtypes.DType, lo, hi int, dims ...int) *tensors.Tensor {
	values := make([]int, shapes.Make(dtype, dims...).Size())
	for i := range values {
		values[i] = lo + rng.IntN(hi-lo)
	}
	if dtype == dtypes.Int64 {
		flat := make([]int64, len(values))
		for i, v := range values {
			flat[i] = int64(v)
		}
		return tensors.FromFlatDataAndDimensions(flat, dims...)
	}
	flat := make([]int32, len(values))
	for i, v := range values {
		flat[i] = int32(v)
	}
	return tensors.FromFlatDataAndDimensions(flat, dims...)
}

// runBoth runs fn on the inputs with simplego's own executors and with this package's, and returns both
// results and how many gathers and scatters this package computed.
func runBoth[F graph.ExecGraphFn](t *testing.T, fn F, inputs ...*tensors.Tensor) (want, got []*tensors.Tensor, calls Counts) {
	t.Helper()
	run := func() []*tensors.Tensor {
		var args []any
		for _, x := range inputs {
			local, err := x.LocalClone()
			require.NoError(t, err)
			args = append(args, local)
		}
		return graph.MustNewExec(computetest.PureGo(t), fn).MustExec(args...)
	}
	Uninstall()
	want = run()
	require.NoError(t, Install())
	before := Calls()
	got = run()
	after := Calls()
	return want, got, Counts{Gathers: after.Gathers - before.Gathers, Scatters: after.Scatters - before.Scatters,
		Slices: after.Slices - before.Slices}
}

// requireSameBits compares two tensors' flat data bit for bit.
func requireSameBits(t *testing.T, want, got *tensors.Tensor, what string) {
	t.Helper()
	require.True(t, want.Shape().Equal(got.Shape()), "%s: shape %s, want %s", what, got.Shape(), want.Shape())
	switch want.DType() {
	default:
		require.Equal(t, want.Value(), got.Value(), what)
	case dtypes.Float32:
		w, g := tensors.MustCopyFlatData[float32](want), tensors.MustCopyFlatData[float32](got)
		for i := range w {
			require.Equal(t, math.Float32bits(w[i]), math.Float32bits(g[i]), "%s: element %d", what, i)
		}
	case dtypes.Float64:
		w, g := tensors.MustCopyFlatData[float64](want), tensors.MustCopyFlatData[float64](got)
		for i := range w {
			require.Equal(t, math.Float64bits(w[i]), math.Float64bits(g[i]), "%s: element %d", what, i)
		}
	}
}

// TestRowGathersAndTheirGradients: gathers of whole rows (embedding lookups, one element per row, rows of
// a rank-3 table) and the scatter-adds of their gradients give simplego's results bit for bit, and run
// here; a gather of single elements of a matrix is left to simplego.
func TestRowGathersAndTheirGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	// lookupAndGradient gathers the table's rows, weighs them, and differentiates with respect to the table:
	// the gradient is a ScatterSum of the weights into zeros.
	lookupAndGradient := func(table, indices, weights *graph.Node) []*graph.Node {
		picked := graph.Gather(table, indices)
		loss := graph.ReduceAllSum(graph.Mul(picked, weights))
		return []*graph.Node{picked, graph.Gradient(loss, table)[0]}
	}
	tests := []struct {
		name          string
		table         shapes.Shape
		indices       *tensors.Tensor
		rows          bool // whole rows: computed here
		wantScatters  uint64
		pickedWeights []int // dims of the gathered output
	}{
		{"embedding, int32 tokens", shapes.Make(dtypes.Float32, 50, 8),
			indicesTensor(rng, dtypes.Int32, 0, 50, 3, 4, 1), true, 1, []int{3, 4, 8}},
		{"repeated tokens add up in order", shapes.Make(dtypes.Float32, 3, 16),
			indicesTensor(rng, dtypes.Int32, 0, 3, 40, 1), true, 1, []int{40, 16}},
		{"one element per row, int64", shapes.Make(dtypes.Float32, 60),
			indicesTensor(rng, dtypes.Int64, 0, 60, 7, 1), true, 1, []int{7}},
		{"rows of a rank-3 table, float64", shapes.Make(dtypes.Float64, 10, 3, 4),
			indicesTensor(rng, dtypes.Int32, 0, 10, 2, 5, 1), true, 1, []int{2, 5, 3, 4}},
		{"single elements of a matrix", shapes.Make(dtypes.Float32, 5, 6),
			tensors.FromValue([][]int32{{0, 1}, {4, 5}, {2, 2}}), false, 0, []int{3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			table := computetest.RandomTensor(rng, tc.table)
			weights := computetest.RandomTensor(rng, shapes.Make(tc.table.DType, tc.pickedWeights...))
			want, got, calls := runBoth(t, lookupAndGradient, table, tc.indices, weights)
			requireSameBits(t, want[0], got[0], "gathered")
			requireSameBits(t, want[1], got[1], "gradient")
			if tc.rows {
				assert.Equal(t, uint64(1), calls.Gathers, "gathers computed here")
				assert.Equal(t, tc.wantScatters, calls.Scatters, "scatters computed here")
			} else {
				assert.Zero(t, calls.Gathers+calls.Scatters, "left to simplego")
			}
		})
	}
}

// TestGatherClampsAsSimplego: out-of-range indices read the first or last row, as XLA specifies and
// simplego does.
func TestGatherClampsAsSimplego(t *testing.T) {
	table := computetest.RandomTensor(rand.New(rand.NewPCG(1, 1)), shapes.Make(dtypes.Float32, 4, 3))
	indices := tensors.FromValue([][]int32{{-7}, {0}, {3}, {4}, {100}})
	want, got, calls := runBoth(t, func(table, indices *graph.Node) *graph.Node { return graph.Gather(table, indices) },
		table, indices)
	requireSameBits(t, want[0], got[0], "gathered")
	assert.Equal(t, uint64(1), calls.Gathers)
}

// TestScatterSkipsOutOfRangeRows: a scatter-add's update whose index is outside the table is dropped, as
// XLA specifies (simplego's own scatter does not check), and the table is added to, not replaced.
func TestScatterSkipsOutOfRangeRows(t *testing.T) {
	require.NoError(t, Install())
	exec := graph.MustNewExec(computetest.PureGo(t), func(table, indices, updates *graph.Node) *graph.Node {
		return graph.ScatterSum(table, indices, updates, false, false)
	})
	table := tensors.FromValue([][]float32{{1, 1}, {2, 2}, {3, 3}})
	indices := tensors.FromValue([][]int32{{2}, {-1}, {0}, {3}, {2}})
	updates := tensors.FromValue([][]float32{{10, 20}, {100, 100}, {1, 2}, {100, 100}, {0.5, 0.25}})
	before := Calls()
	got := exec.MustExec(table, indices, updates)[0]
	assert.Equal(t, uint64(1), Calls().Scatters-before.Scatters)
	assert.Equal(t, [][]float32{{2, 3}, {2, 2}, {13.5, 23.25}}, got.Value())
}
