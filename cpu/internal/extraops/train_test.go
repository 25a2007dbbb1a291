package extraops_test

import (
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/layers/batchnorm"
	"github.com/gomlx/gomlx/pkg/ml/layers/lstm"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/extraops"
)

// trainCase is a tiny regression model: a prediction of targets from inputs.
type trainCase struct {
	name          string
	learningRate  float64
	input, target []int
	model         func(ctx *context.Context, x *graph.Node) *graph.Node
	// ran reports whether the counts show this package's path was used.
	ran func(before, after extraops.Counts) bool
}

var trainCases = []trainCase{
	{name: "batchnorm.New", learningRate: 0.05, input: []int{16, 6}, target: []int{16, 1},
		model: func(ctx *context.Context, x *graph.Node) *graph.Node {
			h := layers.DenseWithBias(ctx.In("hidden"), x, 8)
			h = activations.Relu(batchnorm.New(ctx.In("bn"), h, -1).Done())
			return layers.DenseWithBias(ctx.In("out"), h, 1)
		},
		ran: func(before, after extraops.Counts) bool { return after.BatchNorms > before.BatchNorms }},
	{name: "lstm.New", learningRate: 0.5, input: []int{8, 5, 3}, target: []int{8, 1},
		model: func(ctx *context.Context, x *graph.Node) *graph.Node {
			_, last, _ := lstm.New(ctx.In("lstm"), x, 6).Done()
			return layers.DenseWithBias(ctx.In("out"), graph.Reshape(last, x.Shape().Dimensions[0], -1), 1)
		},
		ran: func(before, after extraops.Counts) bool { return after.Pads > before.Pads }},
	{name: "grouped and depthwise convolutions", learningRate: 0.05, input: []int{8, 6, 6, 4}, target: []int{8, 1},
		model: func(ctx *context.Context, x *graph.Node) *graph.Node {
			g := x.Graph()
			grouped := ctx.In("grouped").VariableWithShape("kernel", shapes.Make(x.DType(), 3, 3, 2, 6)).ValueGraph(g)
			h := activations.Relu(graph.Convolve(x, grouped).PadSame().ChannelGroupCount(2).Done())
			depthwise := ctx.In("depthwise").VariableWithShape("kernel", shapes.Make(x.DType(), 2, 2, 1, 6)).ValueGraph(g)
			h = activations.Relu(graph.Convolve(h, depthwise).Strides(2).ChannelGroupCount(6).Done())
			return layers.DenseWithBias(ctx.In("out"), graph.Reshape(h, x.Shape().Dimensions[0], -1), 1)
		},
		ran: func(before, after extraops.Counts) bool {
			return after.GroupedConvolutions > before.GroupedConvolutions
		}},
	{name: "graph.Pad", learningRate: 0.05, input: []int{8, 6}, target: []int{8, 1},
		model: func(ctx *context.Context, x *graph.Node) *graph.Node {
			h := graph.Tanh(layers.DenseWithBias(ctx.In("hidden"), x, 5))
			fill := ctx.In("pad").VariableWithValue("fill", float32(0.1)).ValueGraph(x.Graph())
			h = graph.Pad(h, fill, backends.PadAxis{}, backends.PadAxis{Start: -1, End: 2, Interior: 1})
			return layers.DenseWithBias(ctx.In("out"), h, 1)
		},
		ran: func(before, after extraops.Counts) bool { return after.Pads > before.Pads }},
}

// TestTrainsOnPureGo trains each tiny model a few SGD steps on a fixed batch, on the pure-Go backend with
// goaccel's kernels, and checks the loss falls.
func TestTrainsOnPureGo(t *testing.T) {
	backend := pureGo(t)
	for i, c := range trainCases {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(30, uint64(i)))
			inputs := toFloat32(t, randomTensor(rng, c.input...))
			targets := toFloat32(t, randomTensor(rng, c.target...))
			ctx := context.New()
			require.NoError(t, ctx.SetRNGStateFromSeed(42))
			optimizer := optimizers.StochasticGradientDescent().WithLearningRate(c.learningRate).Done()
			step, err := context.NewExec(backend, ctx, func(ctx *context.Context, x, y *graph.Node) *graph.Node {
				ctx.SetTraining(x.Graph(), true)
				prediction := c.model(ctx, x)
				loss := graph.ReduceAllMean(graph.Square(graph.Sub(prediction, y)))
				optimizer.UpdateGraph(ctx, x.Graph(), loss)
				return loss
			})
			require.NoError(t, err)
			defer step.Finalize()
			before := extraops.Calls()
			var first, last float32
			for s := range 30 {
				outputs, err := step.Exec(inputs, targets)
				require.NoError(t, err)
				last = tensors.ToScalar[float32](outputs[0])
				if s == 0 {
					first = last
				}
			}
			t.Logf("loss %.4f -> %.4f", first, last)
			assert.Less(t, last, 0.8*first, "the loss did not fall")
			assert.True(t, c.ran(before, extraops.Calls()), "this package's ops did not run")
		})
	}
}
