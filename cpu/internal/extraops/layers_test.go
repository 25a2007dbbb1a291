package extraops_test

import (
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/layers/batchnorm"
	"github.com/gomlx/gomlx/pkg/ml/layers/fnn"
	"github.com/gomlx/gomlx/pkg/ml/layers/lstm"
	"github.com/gomlx/gomlx/pkg/ml/layers/rational"
	"github.com/gomlx/gomlx/pkg/ml/layers/regularizers"
	"github.com/gomlx/gomlx/pkg/ml/layers/vnn"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// layerCase is one of GoMLX's layers applied to an input of the given dimensions.
type layerCase struct {
	name  string
	dims  []int
	layer func(ctx *context.Context, x *graph.Node) *graph.Node
	// gomlxError, when set, is the error GoMLX v0.26.0 itself raises building the layer, on any backend.
	gomlxError string
}

// scaled multiplies x by a trainable vector over its last axis, so that ops applied to it get a gradient.
func scaled(ctx *context.Context, x *graph.Node) *graph.Node {
	last := x.Shape().Dimensions[x.Rank()-1]
	w := ctx.In("scale").VariableWithShape("w", shapes.Make(x.DType(), last)).ValueGraph(x.Graph())
	dims := make([]int, x.Rank())
	for a := range dims {
		dims[a] = 1
	}
	dims[len(dims)-1] = last
	return graph.Mul(x, graph.Reshape(graph.OnePlus(w), dims...))
}

func layerCases() []layerCase {
	cases := []layerCase{
		{name: "batchnorm", dims: []int{4, 6}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return batchnorm.New(ctx, x, -1).Done()
		}},
		{name: "batchnorm channels first", dims: []int{3, 4, 5}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return batchnorm.New(ctx, x, 1).Done()
		}},
		{name: "batchnorm without the backend ops", dims: []int{4, 6}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return batchnorm.New(ctx, x, -1).UseBackendInference(false).Done()
		}},
		{name: "lstm", dims: []int{2, 5, 3}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			all, _, _ := lstm.New(ctx, x, 4).Done()
			return all
		}},
		{name: "lstm bidirectional with peepholes", dims: []int{2, 5, 3}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			all, _, _ := lstm.New(ctx, x, 4).Direction(lstm.DirBidirectional).UsePeephole(true).Done()
			return all
		}},
		{name: "lstm ragged", dims: []int{2, 5, 3}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			all, _, _ := lstm.New(ctx, x, 4).Ragged(graph.Const(x.Graph(), []int32{3, 5})).Done()
			return all
		}, gomlxError: "Where() requires the condition shape to be a prefix"},
		{name: "fnn residual, dropout, regularized", dims: []int{4, 6}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return fnn.New(ctx, x, 3).NumHiddenLayers(2, 5).Residual(true).Dropout(0.1).
				Regularizer(regularizers.Combine(regularizers.L1(0.01), regularizers.L2(0.01))).Done()
		}},
		{name: "fnn batch normalized", dims: []int{4, 6}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return fnn.New(ctx, x, 3).NumHiddenLayers(2, 5).Normalization("batch").Done()
		}},
		{name: "fnn layer normalized", dims: []int{4, 6}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return fnn.New(ctx, x, 3).NumHiddenLayers(2, 5).Normalization("layer").Done()
		}},
		{name: "rational", dims: []int{4, 6}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return rational.New(ctx, x).Done()
		}},
		{name: "vnn", dims: []int{4, 6, 3}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return vnn.New(ctx, x, 3).NumHiddenLayers(1, 4).Done()
		}},
		{name: "rmsnorm", dims: []int{4, 6}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return layers.RMSNorm(ctx, x).Done()
		}},
		{name: "multi-head attention", dims: []int{2, 5, 6}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return layers.MultiHeadAttention(ctx, x, x, x, 2, 3).UseCausalMask().Done()
		}},
		{name: "dropblock", dims: []int{2, 6, 6, 3}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return layers.DropBlock(ctx, scaled(ctx, x)).WithDropoutProbability(0.2).WithBlockSize(2).Done()
		}},
		{name: "piecewise-linear calibration", dims: []int{4, 6}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return layers.PieceWiseLinearCalibration(ctx, x, graph.Const(x.Graph(), []float32{-1, 0, 1}), true)
		}},
		{name: "convolution", dims: []int{2, 6, 6, 4}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(3).PadSame().Done()
		}},
		{name: "convolution with ChannelGroupCount", dims: []int{2, 6, 6, 4}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(3).PadSame().ChannelGroupCount(2).Done()
		}, gomlxError: "kernel input channels (4) must equal input channels (4) divided by FeatureGroupCount (2)"},
		{name: "graph.Convolve grouped", dims: []int{2, 6, 6, 4}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			k := ctx.VariableWithShape("k", shapes.Make(x.DType(), 3, 3, 2, 4)).ValueGraph(x.Graph())
			return graph.Convolve(x, k).PadSame().ChannelGroupCount(2).Done()
		}},
		{name: "graph.Convolve depthwise", dims: []int{2, 6, 6, 4}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			k := ctx.VariableWithShape("k", shapes.Make(x.DType(), 3, 3, 1, 8)).ValueGraph(x.Graph())
			return graph.Convolve(x, k).PadSame().ChannelGroupCount(4).Done()
		}},
		{name: "graph.Convolve batch groups", dims: []int{4, 6, 6, 2}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			k := ctx.VariableWithShape("k", shapes.Make(x.DType(), 3, 3, 2, 4)).ValueGraph(x.Graph())
			return graph.Convolve(x, k).PadSame().BatchGroupCount(2).Done()
		}},
		{name: "pooling", dims: []int{2, 5, 5, 2}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			x = scaled(ctx, x)
			return graph.Add(graph.MaxPool(x).Window(3).Strides(1).PadSame().Done(),
				graph.MeanPool(x).Window(3).Strides(1).PadSame().Done())
		}},
		{name: "interpolation", dims: []int{2, 4, 4, 2}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return graph.Interpolate(scaled(ctx, x), 2, 8, 8, 2).Done()
		}},
		{name: "cumulative sum", dims: []int{4, 6}, layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
			return graph.CumSum(scaled(ctx, x), 1)
		}},
	}
	for _, activation := range activations.TypeValues() {
		cases = append(cases, layerCase{name: "activation " + activation.String(), dims: []int{4, 6},
			layer: func(ctx *context.Context, x *graph.Node) *graph.Node {
				return activations.Apply(activation, layers.DenseWithBias(ctx, x, 3))
			}})
	}
	return cases
}

// TestLayersTrainOnPureGo runs one SGD step through each of GoMLX's layers on the pure-Go backend with
// goaccel's kernels (the kan package is left out: it needs github.com/gomlx/bsplines, which this module does
// not require). The layers GoMLX v0.26.0 cannot build on any backend fail with GoMLX's own error.
func TestLayersTrainOnPureGo(t *testing.T) {
	backend := pureGo(t)
	for _, c := range layerCases() {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.New()
			require.NoError(t, ctx.SetRNGStateFromSeed(7))
			ctx.SetParam(layers.ParamDropoutRate, 0.1)
			optimizer := optimizers.StochasticGradientDescent().Done()
			step, err := context.NewExec(backend, ctx, func(ctx *context.Context, x *graph.Node) *graph.Node {
				ctx.SetTraining(x.Graph(), true)
				loss := graph.ReduceAllMean(graph.Square(c.layer(ctx, x)))
				optimizer.UpdateGraph(ctx, x.Graph(), loss)
				return loss
			})
			require.NoError(t, err)
			defer step.Finalize()
			x := tensors.FromShape(shapes.Make(dtypes.Float32, c.dims...))
			tensors.MutableFlatData(x, func(flat []float32) {
				for i := range flat {
					flat[i] = float32(i%7)/7 - 0.4
				}
			})
			outputs, err := step.Exec(x)
			if c.gomlxError != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), c.gomlxError)
				return
			}
			require.NoError(t, err)
			loss := tensors.ToScalar[float32](outputs[0])
			assert.False(t, loss != loss, "NaN loss")
		})
	}
}
