package convgraph

import (
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
)

// cnnConfig is a small image classifier: [conv 3×3 (SAME), relu, max-pool 2×2] per entry of filters, then a
// hidden dense layer (if hidden > 0) and the logits.
type cnnConfig struct {
	filters    []int
	hidden     int
	numClasses int
}

func (c cnnConfig) logits(ctx *context.Context, images *graph.Node) *graph.Node {
	x := images
	for i, filters := range c.filters {
		scope := ctx.In("conv" + string(rune('0'+i)))
		x = layers.Convolution(scope, x).Filters(filters).KernelSize(3).PadSame().Done()
		x = activations.Relu(x)
		x = graph.MaxPool(x).Window(2).Done()
	}
	x = graph.Reshape(x, x.Shape().Dimensions[0], -1)
	if c.hidden > 0 {
		x = activations.Relu(layers.DenseWithBias(ctx.In("hidden"), x, c.hidden))
	}
	return layers.DenseWithBias(ctx.In("logits"), x, c.numClasses)
}

// newTrainStep returns an executor of one Adam step on a batch (images, labels), returning the batch's loss
// before the update.
func newTrainStep(tb testing.TB, backend backends.Backend, model cnnConfig, learningRate float64) *context.Exec {
	tb.Helper()
	ctx := context.New()
	require.NoError(tb, ctx.SetRNGStateFromSeed(42))
	optimizer := optimizers.Adam().LearningRate(learningRate).Done()
	step, err := context.NewExec(backend, ctx, func(ctx *context.Context, images, labels *graph.Node) *graph.Node {
		logits := model.logits(ctx, images)
		loss := graph.ReduceAllMean(losses.SparseCategoricalCrossEntropyLogits(
			[]*graph.Node{labels}, []*graph.Node{logits}))
		optimizer.UpdateGraph(ctx, images.Graph(), loss)
		return loss
	})
	require.NoError(tb, err)
	return step
}

// randomBatch returns images shaped [batch, size, size, 1] with values in [-1, 1) and labels [batch, 1] in
// [0, numClasses).
func randomBatch(rng *rand.Rand, batch, size, numClasses int) (images, labels *tensors.Tensor) {
	images = computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, batch, size, size, 1))
	classes := make([]int32, batch)
	for i := range classes {
		classes[i] = int32(rng.IntN(numClasses))
	}
	return images, tensors.FromFlatDataAndDimensions(classes, batch, 1)
}

// TestCNNTrainsOnPureGo trains a two-convolution CNN built with layers.Convolution and graph.MaxPool on the
// pure-Go backend, as is and with LowerConvolutions: it memorises a fixed random batch, which needs every
// gradient to flow.
func TestCNNTrainsOnPureGo(t *testing.T) {
	for name, backend := range map[string]backends.Backend{"simplego": computetest.PureGo(t), "lowered": pureGoLowered()} {
		t.Run(name, func(t *testing.T) {
			patch.With(true, func() {
				model := cnnConfig{filters: []int{4, 8}, numClasses: 10}
				step := newTrainStep(t, backend, model, 0.01)
				defer step.Finalize()
				images, labels := randomBatch(rand.New(rand.NewPCG(5, 5)), 16, 12, model.numClasses)
				var firstLoss, lastLoss float32
				for i := range 40 {
					outputs, err := step.Exec(images, labels)
					require.NoError(t, err)
					lastLoss = tensors.ToScalar[float32](outputs[0])
					if i == 0 {
						firstLoss = lastLoss
					}
				}
				t.Logf("loss: %.4f -> %.4f", firstLoss, lastLoss)
				require.Less(t, lastLoss, firstLoss/2, "the CNN did not learn")
			})
		})
	}
}

// fashionMNISTCNN is the CNN the benchmarks time, sized for 28×28 grey images: conv 3×3 1→32, relu, max-pool
// 2, conv 3×3 32→64, relu, max-pool 2, dense 3136→128, relu, dense 128→10.
var fashionMNISTCNN = cnnConfig{filters: []int{32, 64}, hidden: 128, numClasses: 10}

// benchmarkBackends are the pure-Go backend as is and with LowerConvolutions.
func benchmarkBackends(b *testing.B) map[string]backends.Backend {
	return map[string]backends.Backend{"conv=simplego": computetest.PureGo(b), "conv=lowered": pureGoLowered()}
}

// BenchmarkCNNTrainingStep times one training step (forward, backward, Adam update) of fashionMNISTCNN at
// batch 64 on the pure-Go backend, with this package's gradients registered.
func BenchmarkCNNTrainingStep(b *testing.B) {
	for name, backend := range benchmarkBackends(b) {
		b.Run(name, func(b *testing.B) {
			patch.With(true, func() {
				step := newTrainStep(b, backend, fashionMNISTCNN, 0.001)
				defer step.Finalize()
				images, labels := randomBatch(rand.New(rand.NewPCG(6, 6)), 64, 28, fashionMNISTCNN.numClasses)
				_, err := step.Exec(images, labels) // Compiles the graph and initialises the variables.
				require.NoError(b, err)
				for b.Loop() {
					_, err := step.Exec(images, labels)
					require.NoError(b, err)
				}
			})
		})
	}
}

// BenchmarkCNNInference times the forward pass alone of fashionMNISTCNN at batch 64 on the pure-Go backend.
func BenchmarkCNNInference(b *testing.B) {
	for name, backend := range benchmarkBackends(b) {
		b.Run(name, func(b *testing.B) {
			ctx := context.New()
			require.NoError(b, ctx.SetRNGStateFromSeed(42))
			infer, err := context.NewExec(backend, ctx, fashionMNISTCNN.logits)
			require.NoError(b, err)
			defer infer.Finalize()
			images, _ := randomBatch(rand.New(rand.NewPCG(6, 6)), 64, 28, fashionMNISTCNN.numClasses)
			_, err = infer.Exec(images)
			require.NoError(b, err)
			for b.Loop() {
				_, err := infer.Exec(images)
				require.NoError(b, err)
			}
		})
	}
}
