// Package computetest holds what the tests of goaccel's compute patches share: a pure-Go backend that never
// reaches for a plugin download, and random operands.
package computetest

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
)

// Main runs a test binary's tests. Nothing in the compute packages imports XLA, but should anything create
// a backend from the environment, it must not try to download a PJRT plugin.
func Main(m *testing.M) {
	_ = os.Setenv("GOMLX_NO_AUTO_INSTALL", "1")
	os.Exit(m.Run())
}

// Backend returns the pure-Go backend shared by a test binary's tests and benchmarks, created on first use
// (with its operations one after another: see backendConfig).
var Backend = sync.OnceValues(func() (backends.Backend, error) { return simplego.New(backendConfig) })

// PureGo returns the pure-Go backend shared by a test binary's tests and benchmarks: the one the compute
// patches exist for.
func PureGo(tb testing.TB) backends.Backend {
	tb.Helper()
	backend, err := Backend()
	if err != nil {
		tb.Fatalf("creating the pure-Go backend: %v", err)
	}
	return backend
}

// RandomTensor returns a tensor of the given shape (Float32 or Float64) with values uniform in [-1, 1).
func RandomTensor(rng *rand.Rand, shape shapes.Shape) *tensors.Tensor {
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
		panic("RandomTensor: unsupported dtype " + shape.DType.String())
	}
}
