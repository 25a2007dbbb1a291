package cpu

import (
	"testing"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
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
// thread, keeps the backend's own scheduling with more (except under the race detector), and never
// overrides what the user configured.
func TestScheduleOps(t *testing.T) {
	backendsChoice := PureGo
	if raceDetector {
		backendsChoice = SequentialPureGo
	}
	for _, tc := range []struct {
		name   string
		config string
		cfg    Config
		want   string
	}{
		{"one thread", PureGo, Config{Threads: 1}, PureGo + ":" + sequentialOps},
		{"two ranks share two cores", PureGo, Config{LocalSize: 1 << 20}, PureGo + ":" + sequentialOps},
		{"several threads", PureGo, Config{Threads: 4}, backendsChoice},
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
	several := "parallel"
	if raceDetector {
		several = "sequential"
	}
	for threads, want := range map[int]string{1: "sequential", 2: several} {
		_, err := New(Config{Backend: PureGo, Threads: threads})
		require.NoError(t, err)
		assert.Equal(t, want, CurrentKernels().Ops, "%d thread(s)", threads)
	}
}

// TestSetSequentialOps: the schedule of a backend cpu.New made (wrapped by the kernels) can be switched
// both ways, the change is what CurrentKernels reports, and a graph computes the same values either way.
func TestSetSequentialOps(t *testing.T) {
	backend, err := New(Config{Backend: PureGo})
	require.NoError(t, err)
	sb, err := simplegoBackend(backend)
	require.NoError(t, err)
	double := func(x *graph.Node) *graph.Node { return graph.Add(graph.MulScalar(x, 2), graph.Sqrt(graph.Abs(x))) }
	input := []float32{-4, 1, 9, 16}
	var results [][]float32
	for _, sequential := range []bool{true, false, true} {
		require.NoError(t, SetSequentialOps(backend, sequential, true))
		got, err := gomlxpatch.SequentialOps(sb)
		require.NoError(t, err)
		assert.Equal(t, sequential, got)
		want := "parallel (measured)"
		if sequential {
			want = "sequential (measured)"
		}
		assert.Equal(t, want, CurrentKernels().Ops)
		if raceDetector && !sequential {
			continue // simplego's parallel executor races on its own bookkeeping: New never uses it under -race
		}
		out := graph.MustExecOnce(backend, double, input)
		results = append(results, tensors.MustCopyFlatData[float32](out))
	}
	for _, r := range results[1:] {
		assert.Equal(t, results[0], r)
	}
	require.NoError(t, SetSequentialOps(backend, false, false))
	_, err = simplegoBackend(nil)
	assert.ErrorContains(t, err, "not the pure-Go backend")
}
