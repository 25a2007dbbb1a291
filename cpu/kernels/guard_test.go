package kernels

import (
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/cpu/internal/blas"
	"github.com/goaccel/goaccel/cpu/internal/convkernel"
	"github.com/goaccel/goaccel/cpu/internal/elementwise"
	"github.com/goaccel/goaccel/cpu/internal/fusion"
	"github.com/goaccel/goaccel/cpu/internal/gemmgrad"
	"github.com/goaccel/goaccel/cpu/internal/indexing"
)

// presentGoMLX makes the guard read version (listed or not) until the test ends.
func presentGoMLX(t *testing.T, version string, listed bool) {
	saved := gomlxVersion
	gomlxVersion = func() (string, bool) { return version, listed }
	t.Cleanup(func() { gomlxVersion = saved })
}

func TestGuardAcceptsOnlyTheSupportedRelease(t *testing.T) {
	for _, tc := range []struct {
		name       string
		version    string
		listed     bool
		wantInert  bool
		wantReason string
	}{
		{"the supported release", SupportedGoMLX, true, false, ""},
		{"a later release", "v0.27.0", true, true, "v0.27.0"},
		{"an earlier release", "v0.25.0", true, true, "v0.25.0"},
		{"a pseudo-version of the same line", "v0.26.1-0.20260101000000-abcdef012345", true, true, "v0.26.1-0.2026"},
		{"a local replacement", "(devel)", true, true, "(devel)"},
		{"dependencies listed without GoMLX", "", true, true, "does not record"},
		{"a test binary (Go lists no dependencies)", "", false, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			presentGoMLX(t, tc.version, tc.listed)
			why := unsupported()
			if !tc.wantInert {
				assert.Empty(t, why)
				assert.IsType(t, installed{}, newExtension())
				return
			}
			assert.Contains(t, why, tc.wantReason)
			assert.IsType(t, inert{}, newExtension())
		})
	}
}

// trainSteps runs SGD steps of a linear least-squares model on backend and returns the losses: products,
// their gradients, element-wise chains and a reduction, every kind of node the kernels patch.
func trainSteps(t *testing.T, backend backends.Backend) []float32 {
	t.Helper()
	x := tensors.FromValue([][]float32{{1, 2}, {3, 4}, {5, 6}, {7, 8}})
	y := tensors.FromValue([][]float32{{1}, {2}, {3}, {4}})
	w := tensors.FromValue([][]float32{{0}, {0}})
	exec, err := graph.NewExec(backend, func(x, y, w *graph.Node) (*graph.Node, *graph.Node) {
		diff := graph.Sub(graph.Dot(x, w), y)
		loss := graph.ReduceAllMean(graph.Mul(diff, diff))
		grad := graph.Gradient(loss, w)[0]
		return graph.Sub(w, graph.MulScalar(grad, 0.01)), loss
	})
	require.NoError(t, err)
	var losses []float32
	for range 20 {
		out, err := exec.Exec(x, y, w)
		require.NoError(t, err)
		w = out[0]
		losses = append(losses, out[1].Value().(float32))
	}
	return losses
}

// TestFallbackTrainsOnGoMLXKernels: on a GoMLX the kernels were not written for, the backend trains with
// none of goaccel's patches in place (executor tables and gradient rules as GoMLX shipped them), and
// CurrentKernels says why. Then the supported release installs them again, with the same losses to
// float32 rounding.
func TestFallbackTrainsOnGoMLXKernels(t *testing.T) {
	t.Setenv("GOMLX_BACKEND", "")
	cfg := cpu.Config{Backend: cpu.PureGo}
	backend, err := cpu.New(cfg)
	require.NoError(t, err)
	require.True(t, fusion.Installed(), "the supported release installs the kernels")
	want := trainSteps(t, backend)

	presentGoMLX(t, "v0.27.0", true)
	cpu.Register(newExtension())
	t.Cleanup(func() {
		cpu.Register(installed{})
		_, err := cpu.New(cfg)
		assert.NoError(t, err)
	})
	backend, err = cpu.New(cfg)
	require.NoError(t, err)
	k := cpu.CurrentKernels()
	assert.Contains(t, k.Inert, "v0.27.0")
	assert.Equal(t, "gomlx", k.Gradients)
	for name, on := range map[string]bool{"gemm gradients": gemmgrad.Registered(), "BLAS": blas.Installed(),
		"fusion": fusion.Installed(), "element-wise": elementwise.Installed(), "indexing": indexing.Installed(),
		"convolutions": convkernel.Installed()} {
		assert.False(t, on, "%s still installed on an unsupported GoMLX", name)
	}
	fusedBefore := fusion.Calls()
	got := trainSteps(t, backend)
	assert.Equal(t, fusedBefore, fusion.Calls(), "no fused chain may run")
	assert.InDeltaSlice(t, want, got, 1e-4)
	assert.Less(t, got[len(got)-1], got[0], "it trains")
}
