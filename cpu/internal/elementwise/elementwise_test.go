package elementwise

import (
	"fmt"
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

// run executes fn on the pure-Go backend with this package's executors installed or not.
func run(t *testing.T, installed bool, fn func(a, b *graph.Node) *graph.Node, a, b *tensors.Tensor) []float64 {
	t.Helper()
	if installed {
		require.NoError(t, Install())
	} else {
		Uninstall()
	}
	defer Uninstall()
	la, err := a.LocalClone()
	require.NoError(t, err)
	lb, err := b.LocalClone()
	require.NoError(t, err)
	out := graph.MustExecOnce(computetest.PureGo(t), fn, la, lb)
	if out.DType() == dtypes.Float32 {
		values := tensors.MustCopyFlatData[float32](out)
		flat := make([]float64, len(values))
		for i, v := range values {
			flat[i] = float64(v)
		}
		return flat
	}
	return tensors.MustCopyFlatData[float64](out)
}

var binaryFns = map[string]func(a, b *graph.Node) *graph.Node{
	"Add": graph.Add, "Sub": graph.Sub, "Mul": graph.Mul, "Div": graph.Div, "Max": graph.Max, "Min": graph.Min,
}

// TestBroadcastsMatchSimplego compares every binary operation on broadcasts of both block patterns, with
// the small operand on either side, against simplego's own executor: the results must be identical.
func TestBroadcastsMatchSimplego(t *testing.T) {
	cases := []struct {
		large, small []int
		handled      bool
	}{
		{[]int{4, 5, 6, 3}, []int{1, 1, 1, 3}, true}, // a channels-last bias
		{[]int{4, 5, 6, 3}, []int{1, 1, 6, 3}, true},
		{[]int{4, 7}, []int{4, 1}, true},             // a per-example scale
		{[]int{4, 3, 5, 6}, []int{1, 3, 1, 1}, true}, // a channels-first bias: blocks of H·W
		{[]int{4, 3, 5}, []int{4, 3, 1}, true},
		{[]int{4, 3, 5}, []int{4, 1, 5}, false}, // a hole: simplego's
		{[]int{4, 3, 5}, []int{1, 3, 1}, true},
		{[]int{4, 3, 5}, []int{4, 3, 5}, false}, // same shapes: simplego's
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range cases {
		for name, fn := range binaryFns {
			for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64} {
				for _, smallFirst := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/%v/%v/%s/smallFirst=%v", name, c.large, c.small, dtype, smallFirst), func(t *testing.T) {
						a := computetest.RandomTensor(rng, shapes.Make(dtype, c.large...))
						b := computetest.RandomTensor(rng, shapes.Make(dtype, c.small...))
						if smallFirst {
							a, b = b, a
						}
						before := Calls().Broadcasts
						got := run(t, true, fn, a, b)
						if c.handled {
							assert.Equal(t, before+1, Calls().Broadcasts, "not computed by this package")
						} else {
							assert.Equal(t, before, Calls().Broadcasts, "should have been left to simplego")
						}
						want := run(t, false, fn, a, b)
						assert.Equal(t, want, got)
					})
				}
			}
		}
	}
}

// TestSignMatchesSimplego checks Sign on special values and random ones, in place and not.
func TestSignMatchesSimplego(t *testing.T) {
	special := []float64{-3, -0.0, 0, 2.5, math.Inf(1), math.Inf(-1), math.NaN(), 1e-300, -1e-300}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100 {
		special = append(special, rng.NormFloat64())
	}
	for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64} {
		t.Run(dtype.String(), func(t *testing.T) {
			x := tensors.FromFlatDataAndDimensions(special, len(special))
			if dtype == dtypes.Float32 {
				values := make([]float32, len(special))
				for i, v := range special {
					values[i] = float32(v)
				}
				x = tensors.FromFlatDataAndDimensions(values, len(values))
			}
			// Sign of a computed value (owned by the executor: in place) and of a parameter (copied).
			signs := func(a, b *graph.Node) *graph.Node { return graph.Add(graph.Sign(graph.Neg(a)), graph.Sign(b)) }
			before := Calls().Signs
			got := run(t, true, signs, x, x)
			assert.Equal(t, before+2, Calls().Signs)
			want := run(t, false, signs, x, x)
			require.Len(t, got, len(want))
			for i := range want {
				if math.IsNaN(want[i]) {
					assert.True(t, math.IsNaN(got[i]), "element %d", i)
				} else {
					assert.Equal(t, want[i], got[i], "element %d (%g)", i, special[i])
				}
			}
		})
	}
}
