package kernels

import (
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu"
)

// TestNewWhileAnotherRankExecutes: ranks sharing a process each call cpu.New while the others already build
// and execute graphs. New must then rewrite nothing those graphs read (the download setting, simplego's
// executor table and the fallbacks our executors call, the gradient rules): with the same configuration it
// changes nothing, and with another thread budget only the budget. Run with -race, the detector reports
// any write it still makes; without, the results must stay those of a graph run alone.
func TestNewWhileAnotherRankExecutes(t *testing.T) {
	t.Setenv("GOMLX_BACKEND", "")
	cfg := cpu.Config{Backend: cpu.PureGo}
	backend, err := cpu.New(cfg)
	require.NoError(t, err)

	// A bias over a batch (elementwise's broadcast), ReLU and the chain's gradient (fusion), Exp, a matrix
	// product and its gradient (blas, gemmgrad) and a row gather (indexing).
	x := tensors.FromValue([][]float32{{-1, 2, -3, 4}, {5, -6, 7, -8}, {0.5, 1.5, -2.5, 3.5}})
	w := tensors.FromValue([][]float32{{0.1, -0.2}, {0.3, 0.4}, {-0.5, 0.6}, {0.7, -0.8}})
	bias := tensors.FromValue([]float32{0.25, -0.5, 1, -1})
	rows := tensors.FromValue([][]int32{{2}, {0}})
	step := func() []any {
		outputs := graph.MustExecOnceN(backend, func(x, w, bias, rows *graph.Node) []*graph.Node {
			h := activations.Relu(graph.Add(x, graph.ExpandAndBroadcast(bias, x.Shape().Dimensions, []int{0})))
			y := graph.Exp(graph.MulScalar(graph.Dot(h, w), 0.1))
			loss := graph.ReduceAllSum(graph.Gather(y, rows))
			grads := graph.Gradient(loss, x, w)
			return []*graph.Node{loss, grads[0], grads[1]}
		}, x, w, bias, rows)
		values := make([]any, len(outputs))
		for i, output := range outputs {
			values[i] = output.Value()
		}
		return values
	}
	want := step()

	other := cfg
	other.Threads = max(1, cfg.ThreadBudget()-1) // another budget: Apply runs again
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		defer close(stop)
		for range 20 {
			if got := step(); !assert.Equal(t, want, got, "a graph executed while ranks called cpu.New") {
				return
			}
		}
	})
	for _, c := range []cpu.Config{cfg, cfg, other} {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := cpu.New(c); !assert.NoError(t, err) {
					return
				}
			}
		})
	}
	wg.Wait()
	_, err = cpu.New(cfg) // leave the process's kernels as the other tests expect them
	require.NoError(t, err)
}
