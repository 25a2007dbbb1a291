package ready_test

import (
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/cpu/internal/computetest"
	"github.com/goaccel/goaccel/cpu/internal/ready"
	_ "github.com/goaccel/goaccel/cpu/kernels"
)

func TestMain(m *testing.M) { computetest.Main(m) }

// TestMarkedRunFirst: a marked value built after a long chain of operations, on the sequential executor,
// is handed over before the chain runs (the graph was reordered), with the memory the graph outputs and
// the loss's value; the outputs are what the graph computes without marks.
func TestMarkedRunFirst(t *testing.T) {
	backend, err := cpu.New(cpu.Config{Backend: cpu.PureGo + ":ops_sequential"})
	require.NoError(t, err)
	var (
		mu     sync.Mutex
		order  []int
		handed = map[int][]float32{}
		losses []float64
	)
	mark := func(index int) func(flat any, loss float64) {
		return func(flat any, loss float64) {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, index)
			handed[index] = flat.([]float32)
			losses = append(losses, loss)
		}
	}
	before := ready.Calls()
	exec, err := graph.NewExec(backend, func(x *graph.Node) (*graph.Node, *graph.Node) {
		loss := graph.ReduceAllSum(x)
		chain := x
		for range 20 {
			chain = graph.Add(graph.Mul(chain, chain), x)
		}
		late, ok := cpu.MarkReady(chain, loss, 1, mark(1))
		require.True(t, ok)
		early, ok := cpu.MarkReady(graph.MulScalar(x, 2), loss, 0, mark(0))
		require.True(t, ok)
		return late, early
	})
	require.NoError(t, err)
	out := exec.MustExec([]float32{0.25, -0.5, 0.125})
	assert.Equal(t, []int{0, 1}, order, "the early value is handed over first")
	assert.Equal(t, []float64{-0.125, -0.125}, losses)
	assert.Equal(t, []float32{0.5, -1, 0.25}, tensors.MustCopyFlatData[float32](out[1]))
	// The handed-over memory is the output's.
	require.NoError(t, out[1].ConstFlatData(func(flat any) {
		assert.Same(t, &flat.([]float32)[0], &handed[0][0])
	}))
	after := ready.Calls()
	assert.Equal(t, uint64(2), after.Marked-before.Marked)
	assert.Equal(t, uint64(1), after.Reordered-before.Reordered)
	assert.Equal(t, uint64(2), after.Calls-before.Calls)
}
