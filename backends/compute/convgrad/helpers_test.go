package convgrad

import (
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
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

// pureGo is the pure-Go backend shared by the tests and benchmarks: the one this package makes train.
var pureGo = sync.OnceValues(func() (backends.Backend, error) { return simplego.New("") })

func pureGoBackend(tb testing.TB) backends.Backend {
	tb.Helper()
	backend, err := pureGo()
	require.NoError(tb, err)
	return backend
}

// withRegistration runs fn with this package's gradients registered or not, restoring the previous state
// after. Tests using it must not run in parallel with each other.
func withRegistration(register bool, fn func()) {
	wasRegistered := Registered()
	defer func() {
		if wasRegistered {
			Register()
		} else {
			Unregister()
		}
	}()
	if register {
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
