package gemmgrad

import (
	"math"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
)

func TestMain(m *testing.M) { computetest.Main(m) }

// flatFloat64 returns the values of a Float32 or Float64 tensor as float64.
func flatFloat64(tb testing.TB, t *tensors.Tensor) []float64 {
	tb.Helper()
	switch t.DType() {
	case dtypes.Float32:
		values := tensors.MustCopyFlatData[float32](t)
		converted := make([]float64, len(values))
		for i, value := range values {
			converted[i] = float64(value)
		}
		return converted
	case dtypes.Float64:
		return tensors.MustCopyFlatData[float64](t)
	default:
		require.Failf(tb, "unsupported dtype", "tensor of %s", t.Shape())
		return nil
	}
}

// maxRelativeError returns the largest |a-b| / max(1, |a|, |b|) over the elements of want and got: a
// relative error for large values, an absolute one for values below 1, where relative errors of sums that
// cancel out say nothing.
func maxRelativeError(want, got []float64) float64 {
	var worst float64
	for i := range want {
		scale := max(1, math.Abs(want[i]), math.Abs(got[i]))
		worst = max(worst, math.Abs(want[i]-got[i])/scale)
	}
	return worst
}

// largestNodeSize returns the number of elements of the largest single-output node of g.
func largestNodeSize(g *graph.Graph) (largest int, node *graph.Node) {
	for _, n := range g.Nodes() {
		if n.NumOutputs() == 1 && n.Shape().Size() > largest {
			largest, node = n.Shape().Size(), n
		}
	}
	return largest, node
}
