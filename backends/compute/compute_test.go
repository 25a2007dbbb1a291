package compute

import (
	"testing"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends/compute/elementwise"
	"github.com/goaccel/goaccel/backends/compute/fusion"
)

func TestVisibleDeviceForRank(t *testing.T) {
	for _, tc := range []struct {
		current    string
		rank, size int
		want       string
		wantSet    bool
		name       string
	}{
		{"", 0, 1, "", false, "single process keeps every device"},
		{"", 2, 4, "2", true, "unset: GPU of the local rank"},
		{"0,1,2,3", 3, 4, "3", true, "scheduler exposed the node's GPUs to every task"},
		{"4, 5", 1, 2, "5", true, "entries are trimmed"},
		{"GPU-aa,GPU-bb", 0, 2, "GPU-aa", true, "UUIDs work too"},
		{"1", 0, 2, "", false, "one GPU per task already chosen by the scheduler"},
		{"0,1,2", 1, 2, "", false, "a list that does not match the ranks is the user's choice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, set := visibleDeviceForRank(tc.current, tc.rank, tc.size)
			assert.Equal(t, tc.wantSet, set)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestResolve(t *testing.T) {
	t.Setenv("GOMLX_BACKEND", "")
	cfg, reason := Resolve(Config{Backend: "xla:cuda"})
	assert.Equal(t, "xla:cuda", cfg)
	assert.Contains(t, reason, "option")
	cfg, reason = Resolve(Config{Backend: "go", BackendSource: "GOMLX_BACKEND"})
	assert.Equal(t, "go", cfg)
	assert.Contains(t, reason, "GOMLX_BACKEND")
	t.Setenv("GOMLX_BACKEND", "")
	t.Setenv("PJRT_PLUGIN_LIBRARY_PATH", t.TempDir()) // no plugin there, and no download may happen
	cfg, _ = Resolve(Config{})
	assert.Equal(t, PureGo, cfg)
}

func TestNewNamesWhatIsMissing(t *testing.T) {
	t.Setenv("PJRT_PLUGIN_LIBRARY_PATH", t.TempDir())
	_, err := New(Config{Backend: "xla:cuda"})
	if assert.Error(t, err) {
		assert.Contains(t, err.Error(), `"xla:cuda"`)
		assert.Contains(t, err.Error(), "PJRT")
	}
	_, err = New(Config{Backend: "nosuch"})
	assert.ErrorContains(t, err, "nosuch")
}

// TestScheduleOps: a bare pure-Go configuration runs operations sequentially when the process has one
// thread, keeps the backend's own scheduling with more, and never overrides what the user configured.
func TestScheduleOps(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config string
		cfg    Config
		want   string
	}{
		{"one thread", PureGo, Config{Threads: 1}, PureGo + ":" + sequentialOps},
		{"two ranks share two cores", PureGo, Config{LocalSize: 1 << 20}, PureGo + ":" + sequentialOps},
		{"several threads", PureGo, Config{Threads: 4}, PureGo},
		{"simplego's own matmul never runs in parallel", PureGo, Config{Threads: 4, Matmul: "go"}, PureGo + ":" + sequentialOps},
		{"user's options stand", PureGo + ":ops_parallel", Config{Threads: 1}, PureGo + ":ops_parallel"},
		{"other backends untouched", "xla:cpu", Config{Threads: 1}, "xla:cpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := scheduleOps(tc.cfg, tc.config)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestKernelsReportOps: CurrentKernels says how the pure-Go backend New set up schedules operations.
func TestKernelsReportOps(t *testing.T) {
	t.Setenv("GOMLX_BACKEND", "")
	for threads, want := range map[int]string{1: "sequential", 2: "parallel"} {
		_, err := New(Config{Backend: PureGo, Threads: threads})
		require.NoError(t, err)
		assert.Equal(t, want, CurrentKernels().Ops, "%d thread(s)", threads)
	}
}

// TestPureGoBackendPassesBroadcastsThrough: the backend New makes never materialises the broadcasts that
// elementwise.Extend passes through (ReLU's zeros, a bias over a batch), for either convolution form.
func TestPureGoBackendPassesBroadcastsThrough(t *testing.T) {
	t.Setenv("GOMLX_BACKEND", "")
	for _, conv := range []string{"", "graph"} {
		t.Run("conv="+conv, func(t *testing.T) {
			t.Setenv(ConvEnvVar, conv)
			backend, err := New(Config{Backend: PureGo})
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
	backend, err := New(Config{Backend: PureGo})
	require.NoError(t, err)
	assert.Contains(t, CurrentKernels().Elementwise, "fused")
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
