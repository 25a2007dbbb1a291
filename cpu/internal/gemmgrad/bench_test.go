package gemmgrad

import (
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
)

// mlpWidths are the layer widths of the benchmarked MLP: an MNIST-sized input, three hidden layers.
var mlpWidths = []int{784, 512, 512, 512, 10}

const mlpBatch = 256

// mlpTrainingStep is the forward pass and gradient of an MLP: inputs are the batch, its targets, then the
// weights and biases of each layer; outputs are the loss and the gradient of each weight and bias.
func mlpTrainingStep(inputs []*graph.Node) []*graph.Node {
	x, targets, params := inputs[0], inputs[1], inputs[2:]
	activations := x
	for layer := range len(params) / 2 {
		weights, bias := params[2*layer], params[2*layer+1]
		activations = graph.Add(graph.Dot(activations, weights), graph.InsertAxes(bias, 0))
		if layer < len(params)/2-1 {
			activations = graph.MaxScalar(activations, float32(0))
		}
	}
	loss := graph.ReduceAllMean(graph.Square(graph.Sub(activations, targets)))
	return append([]*graph.Node{loss}, graph.Gradient(loss, params...)...)
}

// BenchmarkMLPTrainingStep times one training step (forward and gradient) of an MLP 784→512→512→512→10 at
// batch 256 in float32 on the pure-Go backend, with GoMLX's own Dot gradients ("gomlx") and with ours
// ("gemm"). MB-largest-node is the size of the largest tensor in the step's graph.
func BenchmarkMLPTrainingStep(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	args := []any{
		computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, mlpBatch, mlpWidths[0])),
		computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, mlpBatch, mlpWidths[len(mlpWidths)-1])),
	}
	for layer := range len(mlpWidths) - 1 {
		args = append(args,
			computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, mlpWidths[layer], mlpWidths[layer+1])),
			computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, mlpWidths[layer+1])))
	}

	for _, variant := range []struct {
		name         string
		registerGemm bool
	}{{"gomlx", false}, {"gemm", true}} {
		b.Run(variant.name, func(b *testing.B) {
			patch.With(variant.registerGemm, func() {
				exec, err := graph.NewExec(computetest.PureGo(b), mlpTrainingStep)
				require.NoError(b, err)
				defer exec.Finalize()

				// The first call builds and compiles the graph (with the registration in force): keep it out
				// of the timing.
				outputs, g, err := exec.ExecWithGraph(args...)
				require.NoError(b, err)
				finalizeAll(outputs)
				largest, _ := largestNodeSize(g)

				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					outputs, err := exec.Exec(args...)
					if err != nil {
						b.Fatal(err)
					}
					finalizeAll(outputs)
				}
				b.ReportMetric(float64(largest*dtypes.Float32.Size())/1e6, "MB-largest-node")
			})
		})
	}
}

// finalizeAll frees the outputs' buffers now rather than at garbage collection, so that each step starts
// from the same memory.
func finalizeAll(outputs []*tensors.Tensor) {
	for _, output := range outputs {
		_ = output.FinalizeAll()
	}
}
