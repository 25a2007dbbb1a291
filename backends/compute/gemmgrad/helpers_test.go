package gemmgrad

import (
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	// Nothing here imports XLA, but should anything create a backend from the environment, it must not try
	// to download a PJRT plugin.
	_ = os.Setenv("GOMLX_NO_AUTO_INSTALL", "1")
	os.Exit(m.Run())
}

// pureGo is the pure-Go backend shared by the tests and benchmarks: the one whose speed this package is for.
var pureGo = sync.OnceValues(func() (backends.Backend, error) { return simplego.New("") })

func pureGoBackend(tb testing.TB) backends.Backend {
	tb.Helper()
	backend, err := pureGo()
	require.NoError(tb, err)
	return backend
}

// withRegistration runs fn with the gemm gradients registered or not, restoring the previous state after.
func withRegistration(registerGemm bool, fn func()) {
	wasRegistered := Registered()
	defer func() {
		if wasRegistered {
			Register()
		} else {
			Unregister()
		}
	}()
	if registerGemm {
		Register()
	} else {
		Unregister()
	}
	fn()
}

// randomTensor returns a tensor of the given shape (Float32 or Float64) with values uniform in [-1, 1).
func randomTensor(rng *rand.Rand, shape shapes.Shape) *tensors.Tensor {
	switch shape.DType {
	case dtypes.Float32:
		values := make([]float32, shape.Size())
		for i := range values {
			values[i] = 2*rng.Float32() - 1
		}
		return tensors.FromFlatDataAndDimensions(values, shape.Dimensions...)
	case dtypes.Float64:
		values := make([]float64, shape.Size())
		for i := range values {
			values[i] = 2*rng.Float64() - 1
		}
		return tensors.FromFlatDataAndDimensions(values, shape.Dimensions...)
	default:
		panic("randomTensor: unsupported dtype " + shape.DType.String())
	}
}

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
