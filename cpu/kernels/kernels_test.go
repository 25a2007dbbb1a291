package kernels

import (
	"testing"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/cpu/internal/elementwise"
	"github.com/goaccel/goaccel/cpu/internal/fusion"
)

// TestPureGoBackendPassesBroadcastsThrough: the backend New makes never materialises the broadcasts that
// elementwise.Extend passes through (ReLU's zeros, a bias over a batch), for either convolution form.
func TestPureGoBackendPassesBroadcastsThrough(t *testing.T) {
	t.Setenv("GOMLX_BACKEND", "")
	for _, conv := range []string{"", "graph"} {
		t.Run("conv="+conv, func(t *testing.T) {
			backend, err := cpu.New(cpu.Config{Backend: cpu.PureGo, Convolutions: conv})
			require.NoError(t, err)
			x := tensors.FromValue([][]float32{{-1, 2, -3}, {4, -5, 6}})
			bias := tensors.FromValue([]float32{10, 20, 30})
			before := elementwise.Calls().BroadcastInDims
			got := graph.MustExecOnce(backend, func(x, bias *graph.Node) *graph.Node {
				return graph.Add(activations.Relu(x), graph.ExpandAndBroadcast(bias, x.Shape().Dimensions, []int{0}))
			}, x, bias)
			assert.Equal(t, [][]float32{{10, 22, 30}, {14, 20, 36}}, got.Value())
			assert.Equal(t, before, elementwise.Calls().BroadcastInDims, "a broadcast was materialised")
		})
	}
}

// TestPureGoBackendFusesChains: the backend New makes runs a bias and a ReLU, and the ReLU's gradient, as
// one fused node each, with the results of the unfused operations.
func TestPureGoBackendFusesChains(t *testing.T) {
	t.Setenv("GOMLX_BACKEND", "")
	backend, err := cpu.New(cpu.Config{Backend: cpu.PureGo})
	require.NoError(t, err)
	assert.Contains(t, cpu.CurrentKernels().Elementwise, "fused")
	// Tensors large enough to be worth fusing (4×8).
	values, biasValues := make([][]float32, 4), []float32{0.5, -20, 30, 0, 1, -1, 2, -2}
	want := make([][]float32, 4)
	for i := range values {
		values[i], want[i] = make([]float32, 8), make([]float32, 8)
		for j := range values[i] {
			values[i][j] = float32((i*8+j)%7) - 3
			if values[i][j]+biasValues[j] >= 0 { // ReLU's gradient is 1 where its input is ≥ 0
				want[i][j] = 1
			}
		}
	}
	x, bias := tensors.FromValue(values), tensors.FromValue(biasValues)
	before := fusion.Calls()
	got := graph.MustExecOnce(backend, func(x, bias *graph.Node) *graph.Node {
		h := activations.Relu(graph.Add(x, graph.ExpandAndBroadcast(bias, x.Shape().Dimensions, []int{0})))
		return graph.Gradient(graph.ReduceAllSum(h), x)[0]
	}, x, bias)
	after := fusion.Calls()
	assert.Equal(t, want, got.Value(), "ReLU's gradient")
	assert.Positive(t, after.Chains-before.Chains)
	assert.Positive(t, after.Runs-before.Runs)
	assert.Greater(t, after.Ops-before.Ops, after.Chains-before.Chains, "chains of several operations")
}
