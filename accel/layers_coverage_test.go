package accel_test

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/core/tensors/images"
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

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// The releases a layer trains through goaccel since (docs/layers.md, "Since").
const (
	// sinceNew: it starts training with the unreleased changes (random numbers through PrepareModel; batch
	// normalization, Pad, Reverse and dynamic slices on the pure-Go backend; grouped convolutions; buffers
	// kept identical across processes).
	sinceNew = "0.5.0"
	// sinceVerified: it trains now; CHANGELOG.md does not say whether an earlier release trained it.
	sinceVerified = "verified in 0.5.0"
	// sinceNever: it does not train through goaccel (GoMLX cannot build it, or it is not in this module).
	sinceNever = "—"
)

// Each row trains layerSteps optimizer steps of layerBatch examples per process on one batch, with Adam.
const (
	layerSteps = 8
	layerBatch = 8
)

// layerRow is one of GoMLX v0.26.0's layers, or one option of a layer, trained through the Accelerator on
// testmodel's data. docs/layers.md has a line for each (TestLayerRowsAreDocumented).
type layerRow struct {
	name  string // the first column of docs/layers.md's table, without its backquotes
	since string // the release since which it trains through goaccel
	// model maps the inputs ([b, testmodel.Features]) to logits ([b, testmodel.Classes]), with the layer
	// under test between a Dense layer in scope "in" and one in scope "out".
	model func(ctx *context.Context, x *Node) *Node
	// gomlxError is part of the error GoMLX v0.26.0 itself raises building the model, on every backend: the
	// row does not train, and the test asserts that error.
	gomlxError string
	// missing says why the layer cannot be used through goaccel at all (it does not compile into this
	// module, or it needs GoMLX's own trainer); the row is documented, and checked where it can be.
	missing string
	// noisy rows draw random numbers in training (dropout): their training loss must change, not fall.
	noisy bool
	// averages rows update batch normalization's moving averages in training: one of them must move.
	averages bool
	// check, when set, looks at the trained model on each process.
	check func(model *prepare.Model) error
}

// trains says whether the row trains through goaccel.
func (r layerRow) trains() bool { return r.gomlxError == "" && r.missing == "" }

// layerIn is the trainable projection in front of the layer under test: [b, Features] to [b, dims...].
func layerIn(ctx *context.Context, x *Node, dims ...int) *Node {
	n := 1
	for _, d := range dims {
		n *= d
	}
	return Reshape(layers.Dense(ctx.In("in"), x, true, n), append([]int{-1}, dims...)...)
}

// layerOut is the classifier behind the layer under test: [b, ...] to logits.
func layerOut(ctx *context.Context, h *Node) *Node {
	return layers.Dense(ctx.In("out"), Reshape(h, h.Shape().Dim(0), -1), true, testmodel.Classes)
}

// around is a row's model: layerIn to dims, the layer in scope "layer", then layerOut.
func around(dims []int, layer func(ctx *context.Context, x *Node) *Node) func(*context.Context, *Node) *Node {
	return func(ctx *context.Context, x *Node) *Node {
		return layerOut(ctx, layer(ctx.In("layer"), layerIn(ctx, x, dims...)))
	}
}

// The shapes, per example, that rows feed their layer.
var (
	vecDims   = []int{6}          // features
	imageDims = []int{4, 4, 3}    // height, width, channels
	seqDims   = []int{5, 4}       // positions, features
	vnnDims   = []int{4, 3}       // 3D vectors
	groupDims = []int{4, 4, 4}    // channels divisible by 2 and 4
	firstDims = []int{3, 4, 4}    // channels first
	vol3Dims  = []int{3, 3, 3, 2} // depth, height, width, channels
)

// prefixMask is true on the first valid positions of axis 1 of dims ([b, positions, ...]).
func prefixMask(g *Graph, valid int, dims ...int) *Node {
	return LessThan(Iota(g, shapes.Make(dtypes.Int32, dims...), 1), Const(g, int32(valid)))
}

// f32 is a float32 scalar.
func f32(g *Graph, v float64) *Node { return Scalar(g, dtypes.Float32, v) }

// lastHidden is the LSTM's last hidden state [directions, b, hidden] as [b, directions·hidden].
func lastHidden(l *lstm.LSTM) *Node {
	_, last, _ := l.Done()
	return TransposeAllDims(last, 1, 0, 2)
}

// l1SmallWeights counts the weights of the kernels in scope /layer that are under amount and not zero:
// none once regularizers.L1's per-step update (run by GoMLX's Trainer after each optimizer step) has run.
func l1SmallWeights(model *prepare.Model, amount float64) (small, total int, err error) {
	for _, v := range model.Parameters() {
		if !strings.HasPrefix(v.Scope(), "/layer") || v.Name() != "weights" {
			continue
		}
		values, err := testmodel.FlatFloat64(v)
		if err != nil {
			return 0, 0, err
		}
		for _, w := range values {
			total++
			if w != 0 && math.Abs(w) < amount {
				small++
			}
		}
	}
	if total == 0 {
		return 0, 0, errors.New("no weights in scope /layer")
	}
	return small, total, nil
}

func layerRows() []layerRow {
	rows := []layerRow{
		// Dense and embeddings.
		{name: "layers.Dense", since: "0.1.0", model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Dense(ctx, x, true, 5)
		})},
		{name: "layers.Dense without bias", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Dense(ctx, x, false, 5)
		})},
		{name: "layers.Dense with several output axes", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Dense(ctx, x, true, 2, 3)
		})},
		{name: "layers.Dense on several input axes", since: sinceVerified, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Dense(ctx, x, true, 3)
		})},
		{name: "layers.DenseWithBias", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.DenseWithBias(ctx, x, 5)
		})},
		{name: "layers.Embedding", since: "0.3.0", model: func(ctx *context.Context, x *Node) *Node {
			// Token f·2 + (x_f > 0) for each feature f: 12 tokens.
			g := x.Graph()
			offsets := Reshape(MulScalar(Iota(g, shapes.Make(dtypes.Int32, testmodel.Features), 0), 2), 1, testmodel.Features)
			tokens := Add(offsets, ConvertDType(GreaterThan(x, ZerosLike(x)), dtypes.Int32))
			return layerOut(ctx, layers.Embedding(ctx.In("layer"), tokens, dtypes.Float32, 2*testmodel.Features, 4))
		}},

		// Convolutions.
		{name: "layers.Convolution", since: "0.2.0", model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(3).PadSame().Done()
		})},
		{name: "layers.Convolution NoPadding", since: sinceVerified, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(3).NoPadding().Done()
		})},
		{name: "layers.Convolution Strides", since: sinceVerified, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(3).Strides(2).PadSame().Done()
		})},
		{name: "layers.Convolution Dilations", since: sinceVerified, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(2).Dilations(2).PadSame().Done()
		})},
		{name: "layers.Convolution StridePerAxis", since: sinceVerified, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(3).StridePerAxis(2, 1).PadSame().Done()
		})},
		{name: "layers.Convolution DilationPerAxis", since: sinceVerified, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(2).DilationPerAxis(1, 2).PadSame().Done()
		})},
		{name: "layers.Convolution KernelSizePerAxis", since: sinceVerified, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSizePerAxis(3, 1).PadSame().Done()
		})},
		{name: "layers.Convolution UseBias(false)", since: sinceVerified, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(3).PadSame().UseBias(false).Done()
		})},
		{name: "layers.Convolution ChannelsAxis(images.ChannelsFirst)", since: sinceVerified, model: around(firstDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(3).PadSame().ChannelsAxis(images.ChannelsFirst).Done()
		})},
		{name: "layers.Convolution with 1 spatial axis", since: sinceVerified, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(3).PadSame().Done()
		})},
		{name: "layers.Convolution with 3 spatial axes", since: sinceVerified, model: around(vol3Dims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(3).KernelSize(2).PadSame().Done()
		})},
		{name: "layers.Convolution Regularizer", since: sinceVerified, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(3).PadSame().Regularizer(regularizers.L2(0.01)).Done()
		})},
		{name: "layers.Convolution ChannelGroupCount", since: sinceNever, model: around(groupDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Convolution(ctx, x).Filters(4).KernelSize(3).PadSame().ChannelGroupCount(2).Done()
		}), gomlxError: "kernel input channels (4) must equal input channels (4) divided by FeatureGroupCount (2)"},
		{name: "layers.Convolution BatchGroupCount", since: sinceNew, model: func(ctx *context.Context, x *Node) *Node {
			// Each example holds two images; the batch groups are the first and the second images of all
			// examples, so the output has one image per example.
			pairs := layerIn(ctx, x, 2, 4, 4, 2) // [b, 2, 4, 4, 2]
			b := pairs.Shape().Dim(0)
			stacked := Reshape(TransposeAllDims(pairs, 1, 0, 2, 3, 4), 2*b, 4, 4, 2)
			return layerOut(ctx, layers.Convolution(ctx.In("layer"), stacked).Filters(4).KernelSize(3).PadSame().
				BatchGroupCount(2).Done())
		}},
		{name: "graph.Convolve with ChannelGroupCount", since: sinceNew, model: around(groupDims, func(ctx *context.Context, x *Node) *Node {
			// The working path for a grouped convolution: a [kh, kw, in/g, out] kernel.
			k := ctx.VariableWithShape("weights", shapes.Make(x.DType(), 3, 3, 2, 4)).ValueGraph(x.Graph())
			return Convolve(x, k).PadSame().ChannelGroupCount(2).Done()
		})},
		{name: "graph.Convolve depthwise", since: sinceNew, model: around(groupDims, func(ctx *context.Context, x *Node) *Node {
			k := ctx.VariableWithShape("weights", shapes.Make(x.DType(), 3, 3, 1, 8)).ValueGraph(x.Graph())
			return Convolve(x, k).PadSame().ChannelGroupCount(4).Done()
		})},

		// Pooling.
		{name: "graph.MaxPool", since: "0.2.0", model: around(imageDims, func(_ *context.Context, x *Node) *Node {
			return MaxPool(x).Window(2).Done()
		})},
		{name: "graph.MaxPool PadSame with stride 1", since: sinceVerified, model: around(imageDims, func(_ *context.Context, x *Node) *Node {
			return MaxPool(x).Window(3).Strides(1).PadSame().Done()
		})},
		{name: "graph.MinPool", since: sinceVerified, model: around(imageDims, func(_ *context.Context, x *Node) *Node {
			return MinPool(x).Window(2).Done()
		})},
		{name: "graph.MeanPool", since: sinceVerified, model: around(imageDims, func(_ *context.Context, x *Node) *Node {
			return MeanPool(x).Window(2).Done()
		})},
		{name: "graph.MeanPool PadSame with stride 1", since: sinceVerified, model: around(imageDims, func(_ *context.Context, x *Node) *Node {
			return MeanPool(x).Window(3).Strides(1).PadSame().Done()
		})},
		{name: "graph.SumPool", since: sinceVerified, model: around(imageDims, func(_ *context.Context, x *Node) *Node {
			return SumPool(x).Window(2).Done()
		})},
		{name: "graph.ConcatPool", since: sinceVerified, model: around(imageDims, func(_ *context.Context, x *Node) *Node {
			return ConcatPool(x).Window(2).Done()
		})},

		// Normalizations.
		{name: "layers.LayerNormalization", since: "0.3.0", model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.LayerNormalization(ctx, x, -1).Done()
		})},
		{name: "layers.LayerNormalization Epsilon", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.LayerNormalization(ctx, x, -1).Epsilon(1e-3).Done()
		})},
		{name: "layers.LayerNormalization without learned gain and offset", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.LayerNormalization(ctx, x, -1).LearnedGain(false).LearnedOffset(false).Done()
		})},
		{name: "layers.LayerNormalization ScaleNormalization(false)", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.LayerNormalization(ctx, x, -1).ScaleNormalization(false).Done()
		})},
		{name: "layers.LayerNormalization over several axes", since: sinceVerified, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.LayerNormalization(ctx, x, -2, -1).Done()
		})},
		{name: "layers.LayerNormalization Mask", since: sinceVerified, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			dims := x.Shape().Dimensions
			return layers.LayerNormalization(ctx, x, -1).Mask(prefixMask(x.Graph(), 4, dims...)).Done()
		})},
		{name: "layers.RMSNorm", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.RMSNorm(ctx, x).Done()
		})},
		{name: "layers.RMSNorm WithScale(false)", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.RMSNorm(ctx, x).WithScale(false).Done()
		})},
		{name: "layers.RMSNorm WithEpsilon", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.RMSNorm(ctx, x).WithEpsilon(1e-3).Done()
		})},
		{name: "layers.RMSNorm WithNormalizationAxes", since: sinceVerified, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.RMSNorm(ctx, x).WithNormalizationAxes(-2, -1).Done()
		})},
		{name: "layers.Normalize", since: sinceNever, model: around(imageDims, func(_ *context.Context, x *Node) *Node {
			return layers.Normalize(x, 3)
		}), gomlxError: "doesnt match original size"},
		{name: "layers.Normalize with a negative axis", since: sinceNever, model: around(vecDims, func(_ *context.Context, x *Node) *Node {
			return layers.Normalize(x, -1)
		}), gomlxError: "index out of range [-1]"},
		{name: `layers.MustNormalizeByName("layer")`, since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.MustNormalizeByName(ctx, "layer", x)
		})},
		{name: `layers.MustNormalizeByName("rms")`, since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.MustNormalizeByName(ctx, "rms", x)
		})},
		{name: `layers.MustNormalizeByName("batch")`, since: sinceNew, averages: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.MustNormalizeByName(ctx, "batch", x)
		})},
		{name: `layers.MustNormalizeByName("none")`, since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.MustNormalizeByName(ctx, "none", x)
		})},
		{name: "layers.NormalizeFromContext", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			ctx.SetParam(layers.ParamNormalization, "layer")
			return layers.NormalizeFromContext(ctx, x)
		})},
		{name: "layers.MaskedNormalizeFromContext", since: sinceVerified, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			ctx.SetParam(layers.ParamNormalization, "layer")
			return layers.MaskedNormalizeFromContext(ctx, x, prefixMask(x.Graph(), 4, x.Shape().Dimensions...))
		})},

		// Attention.
		{name: "layers.MultiHeadAttention", since: sinceVerified, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			return layers.MultiHeadAttention(ctx, x, x, x, 2, 4).Done()
		})},
		{name: "layers.MultiHeadAttention UseCausalMask", since: "0.3.0", model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			return layers.MultiHeadAttention(ctx, x, x, x, 2, 4).UseCausalMask().Done()
		})},
		{name: "layers.MultiHeadAttention Dropout", since: sinceNew, noisy: true, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			return layers.MultiHeadAttention(ctx, x, x, x, 2, 4).Dropout(0.3).Done()
		})},
		{name: "layers.MultiHeadAttention SetKeyMask", since: sinceVerified, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			b := x.Shape().Dim(0)
			return layers.MultiHeadAttention(ctx, x, x, x, 2, 4).SetKeyMask(prefixMask(x.Graph(), 3, b, 5)).Done()
		})},
		{name: "layers.MultiHeadAttention SetQueryMask", since: sinceVerified, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			b := x.Shape().Dim(0)
			return layers.MultiHeadAttention(ctx, x, x, x, 2, 4).SetQueryMask(prefixMask(x.Graph(), 3, b, 5)).Done()
		})},
		{name: "layers.MultiHeadAttention SetQueryKeyMatrixMask", since: sinceNever, gomlxError: "invalid shape for queryKeyMatrixMask", model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			b := x.Shape().Dim(0)
			return layers.MultiHeadAttention(ctx, x, x, x, 2, 4).SetQueryKeyMatrixMask(prefixMask(x.Graph(), 3, b, 5, 5)).Done()
		})},
		{name: "layers.MultiHeadAttention SetKeyQueryDim, SetValueHeadDim, SetOutputDim", since: sinceVerified, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			return layers.MultiHeadAttention(ctx, x, x, x, 2, 4).SetKeyQueryDim(3).SetValueHeadDim(2).SetOutputDim(6).Done()
		})},
		{name: "layers.MultiHeadAttention UseProjectionBias(false)", since: sinceVerified, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			return layers.MultiHeadAttention(ctx, x, x, x, 2, 4).UseProjectionBias(false).Done()
		})},
		{name: "layers.MultiHeadAttention DoneWithCoefficients", since: sinceVerified, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			out, coefficients := layers.MultiHeadAttention(ctx, x, x, x, 2, 4).DoneWithCoefficients()
			b := x.Shape().Dim(0)
			return Concatenate([]*Node{Reshape(out, b, -1), Reshape(coefficients, b, -1)}, -1)
		})},

		// Dropout.
		{name: "layers.Dropout", since: sinceNew, noisy: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.Dropout(ctx, x, f32(x.Graph(), 0.3))
		})},
		{name: "layers.DropoutStatic", since: sinceNew, noisy: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.DropoutStatic(ctx, x, 0.3)
		})},
		{name: "layers.DropoutNormalize", since: sinceNew, noisy: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.DropoutNormalize(ctx, x, f32(x.Graph(), 0.3), false)
		})},
		{name: "layers.DropoutFromContext", since: sinceNew, noisy: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			ctx.SetParam(layers.ParamDropoutRate, 0.3)
			return layers.DropoutFromContext(ctx, x)
		})},
		{name: "layers.DropPath", since: sinceNew, noisy: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return Add(x, layers.DropPath(ctx, Tanh(x), f32(x.Graph(), 0.3)))
		})},
		{name: "layers.DropPathFromContext", since: sinceNew, noisy: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			ctx.SetParam(layers.ParamDropPathProbability, 0.3)
			return Add(x, layers.DropPathFromContext(ctx, Tanh(x)))
		})},
		{name: "layers.DropBlock", since: sinceNew, noisy: true, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.DropBlock(ctx, x).WithDropoutProbability(0.3).WithBlockSize(2).Done()
		})},
		{name: "layers.DropBlock WithBlockSize(1)", since: sinceNew, noisy: true, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.DropBlock(ctx, x).WithDropoutProbability(0.3).WithBlockSize(1).Done()
		})},
		{name: "layers.DropBlock WithBlockSizes", since: sinceNew, noisy: true, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.DropBlock(ctx, x).WithDropoutProbability(0.3).WithBlockSizes(2, 1).Done()
		})},
		{name: "layers.DropBlock ChannelsAxis(images.ChannelsFirst)", since: sinceNew, noisy: true, model: around(firstDims, func(ctx *context.Context, x *Node) *Node {
			return layers.DropBlock(ctx, x).ChannelsAxis(images.ChannelsFirst).WithDropoutProbability(0.3).WithBlockSize(2).Done()
		})},
		{name: "layers.DropBlock FullShape", since: sinceNew, noisy: true, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.DropBlock(ctx, x).FullShape().WithDropoutProbability(0.3).WithBlockSizes(1, 2, 2, 1).Done()
		})},
		{name: "layers.DropBlock WithDropoutProbabilityNode", since: sinceNew, noisy: true, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return layers.DropBlock(ctx, x).WithDropoutProbabilityNode(f32(x.Graph(), 0.3)).WithBlockSize(2).Done()
		})},

		// Calibration and regularization helpers of package layers.
		{name: "layers.PieceWiseLinearCalibration", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.PieceWiseLinearCalibration(ctx, x, Const(x.Graph(), []float32{-1, 0, 1}), true)
		})},
		{name: "layers.PieceWiseLinearCalibration with fixed outputs", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.PieceWiseLinearCalibration(ctx, x, Const(x.Graph(), []float32{-1, 0, 1}), false)
		})},
		{name: "layers.PieceWiseLinearCalibrationCascaded", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return layers.PieceWiseLinearCalibrationCascaded(ctx, x, Const(x.Graph(), []float32{-1, 0, 1}), true)
		})},
		{name: "layers.AddL2Regularization", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			layers.AddL2Regularization(ctx, f32(x.Graph(), 0.01), x)
			return x
		})},
		{name: "layers.AddL2RegularizationStatic", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			layers.AddL2RegularizationStatic(ctx, 0.01, x)
			return x
		})},

		// fnn.
		{name: "fnn.New", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).Done()
		})},
		{name: "fnn NumHiddenLayers", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).NumHiddenLayers(2, 6).Done()
		})},
		{name: "fnn UseBias(false)", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).NumHiddenLayers(1, 6).UseBias(false).Done()
		})},
		{name: "fnn Activation", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).NumHiddenLayers(1, 6).Activation(activations.TypeSwish).Done()
		})},
		{name: "fnn Residual", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).NumHiddenLayers(2, 6).Residual(true).Done()
		})},
		{name: `fnn Normalization("layer")`, since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).NumHiddenLayers(2, 6).Normalization("layer").Done()
		})},
		{name: `fnn Normalization("rms")`, since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).NumHiddenLayers(2, 6).Normalization("rms").Done()
		})},
		{name: `fnn Normalization("batch")`, since: sinceNew, averages: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).NumHiddenLayers(2, 6).Normalization("batch").Done()
		})},
		{name: "fnn Regularizer", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).NumHiddenLayers(1, 6).Regularizer(regularizers.L2(0.01)).Done()
		})},
		{name: "fnn Dropout", since: sinceNew, noisy: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).NumHiddenLayers(2, 6).Dropout(0.3).Done()
		})},
		{name: "fnn Residual, Dropout, Normalization and Regularizer together", since: sinceNew, noisy: true, averages: true,
			model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
				return fnn.New(ctx, x, 5).NumHiddenLayers(2, 6).Residual(true).Dropout(0.2).Normalization("batch").
					Regularizer(regularizers.Combine(regularizers.L1(0.001), regularizers.L2(0.01))).Done()
			})},

		// batchnorm: trained with the batch's statistics, Predict normalizes with the moving averages.
		{name: "batchnorm.New", since: sinceNew, averages: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return batchnorm.New(ctx, x, -1).Done()
		})},
		{name: "batchnorm.New on images", since: sinceNew, averages: true, model: around(imageDims, func(ctx *context.Context, x *Node) *Node {
			return batchnorm.New(ctx, x, -1).Done()
		})},
		{name: "batchnorm.New channels first", since: sinceNew, averages: true, model: around(firstDims, func(ctx *context.Context, x *Node) *Node {
			return batchnorm.New(ctx, x, 1).Done()
		})},
		{name: "batchnorm Momentum", since: sinceNew, averages: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return batchnorm.New(ctx, x, -1).Momentum(0.5).Done()
		})},
		{name: "batchnorm Epsilon", since: sinceNew, averages: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return batchnorm.New(ctx, x, -1).Epsilon(1e-3).Done()
		})},
		{name: "batchnorm Center(false)", since: sinceNew, averages: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return batchnorm.New(ctx, x, -1).Center(false).Done()
		})},
		{name: "batchnorm Scale(false)", since: sinceNew, averages: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return batchnorm.New(ctx, x, -1).Scale(false).Done()
		})},
		{name: "batchnorm UseBackendInference(false)", since: sinceNew, averages: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return batchnorm.New(ctx, x, -1).UseBackendInference(false).Done()
		})},
		{name: "batchnorm CurrentScope", since: sinceNew, averages: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return batchnorm.New(ctx, x, -1).CurrentScope().Done()
		})},
		{name: "batchnorm FrozenAverages(true)", since: sinceNew, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return batchnorm.New(ctx, x, -1).FrozenAverages(true).Done()
		})},
		{name: "batchnorm Trainable(false)", since: sinceNew, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return batchnorm.New(ctx, x, -1).Trainable(false).Done()
		})},
		{name: "batchnorm.UpdateAverages", since: sinceNever,
			missing: "it recomputes the averages through GoMLX's train.Trainer, which a goaccel loop does not have"},

		// lstm.
		{name: "lstm.New", since: sinceNew, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			return lastHidden(lstm.New(ctx, x, 4))
		})},
		{name: "lstm.New all hidden states", since: sinceNew, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			all, _, _ := lstm.New(ctx, x, 4).Done()
			return TransposeAllDims(all, 2, 0, 1, 3)
		})},
		{name: "lstm Direction(lstm.DirReverse)", since: sinceNew, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			return lastHidden(lstm.New(ctx, x, 4).Direction(lstm.DirReverse))
		})},
		{name: "lstm Direction(lstm.DirBidirectional)", since: sinceNew, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			return lastHidden(lstm.New(ctx, x, 4).Direction(lstm.DirBidirectional))
		})},
		{name: "lstm UsePeephole", since: sinceNew, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			return lastHidden(lstm.New(ctx, x, 4).UsePeephole(true))
		})},
		{name: "lstm InitialStates", since: sinceNew, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			b := x.Shape().Dim(0)
			first := Reshape(Slice(x, AxisRange(), AxisElem(0)), b, -1)
			h0 := Reshape(Tanh(layers.Dense(ctx.In("h0"), first, true, 4)), 1, b, 4)
			c0 := Reshape(layers.Dense(ctx.In("c0"), first, true, 4), 1, b, 4)
			return lastHidden(lstm.New(ctx, x, 4).InitialStates(h0, c0))
		})},
		{name: "lstm.NewWithWeights", since: sinceNew, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			g, dtype := x.Graph(), x.DType()
			inputsW := ctx.VariableWithShape("inputsW", shapes.Make(dtype, 1, 4, 4, 4)).ValueGraph(g)
			recurrentW := ctx.VariableWithShape("recurrentW", shapes.Make(dtype, 1, 4, 4, 4)).ValueGraph(g)
			biases := ctx.VariableWithShape("biases", shapes.Make(dtype, 1, 8, 4)).ValueGraph(g)
			return lastHidden(lstm.NewWithWeights(x, inputsW, recurrentW, biases, nil))
		})},
		{name: "lstm Ragged", since: sinceNever, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			lengths := make([]int32, x.Shape().Dim(0))
			for i := range lengths {
				lengths[i] = int32(3 + i%3)
			}
			return lastHidden(lstm.New(ctx, x, 4).Ragged(Const(x.Graph(), lengths)))
		}), gomlxError: "Where() requires the condition shape to be a prefix"},
		{name: "lstm with ragged sequences by masking", since: sinceNew, model: around(seqDims, func(ctx *context.Context, x *Node) *Node {
			// The working path for a forward LSTM over sequences of different lengths: the hidden state at
			// each sequence's last position, picked from all of them (later positions do not change it).
			g, dtype := x.Graph(), x.DType()
			b, length := x.Shape().Dim(0), x.Shape().Dim(1)
			lengths := make([]int32, b)
			for i := range lengths {
				lengths[i] = int32(3 + i%3)
			}
			all, _, _ := lstm.New(ctx, x, 4).Done() // [positions, 1, b, hidden]
			positions := Iota(g, shapes.Make(dtypes.Int32, length, 1, b, 1), 0)
			last := Reshape(AddScalar(Const(g, lengths), -1), 1, 1, b, 1)
			picked := ReduceSum(Mul(all, ConvertDType(Equal(positions, last), dtype)), 0) // [1, b, hidden]
			return TransposeAllDims(picked, 1, 0, 2)
		})},

		// Activations not reached through activations.Apply.
		{name: "activations.LeakyReluWithAlpha", since: sinceVerified, model: around(vecDims, func(_ *context.Context, x *Node) *Node {
			return activations.LeakyReluWithAlpha(x, 0.1)
		})},
		{name: "activations.ApplyFromContext", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			ctx.SetParam(activations.ParamActivation, "swish")
			return activations.ApplyFromContext(ctx, x)
		})},

		// regularizers, on an fnn's weights.
		{name: "regularizers.L2", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).Regularizer(regularizers.L2(0.01)).Done()
		})},
		{name: "regularizers.L1", since: sinceNew, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).Regularizer(regularizers.L1(l1Amount)).Done()
		}), check: func(model *prepare.Model) error {
			// L1's per-step update (train.AddPerStepUpdateGraphFn) sets the weights under the amount to zero
			// after each optimizer step, as in GoMLX's Trainer: none may be left small and non-zero.
			small, total, err := l1SmallWeights(model, l1Amount)
			if err == nil && small > 0 {
				err = fmt.Errorf("%d of %d weights are under L1's amount %g and not zero: its per-step update did not run",
					small, total, l1Amount)
			}
			return err
		}},
		{name: "regularizers.ConstantL1", since: sinceNew, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).Regularizer(regularizers.ConstantL1(0.01)).Done()
		})},
		{name: "regularizers.Combine", since: sinceNew, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return fnn.New(ctx, x, 5).Regularizer(regularizers.Combine(regularizers.L2(0.01), regularizers.ConstantL1(0.01))).Done()
		})},
		{name: "regularizers.FromContext", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			ctx.SetParam(regularizers.ParamL2, 0.01)
			return fnn.New(ctx, x, 5).Regularizer(regularizers.FromContext(ctx)).Done()
		})},

		// rational.
		{name: "rational.New", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return rational.New(ctx, x).Done()
		})},
		{name: "rational WithInputGroups", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return rational.New(ctx, x).WithInputGroups(2).Done()
		})},
		{name: "rational WithMultipleOutputs", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return rational.New(ctx, x).WithMultipleOutputs(2).Done()
		})},
		{name: "rational WithDegrees", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return rational.New(ctx, x).WithDegrees(3, 2).Done()
		})},
		{name: `rational Version("A")`, since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return rational.New(ctx, x).Version("A").Done()
		})},
		{name: `rational Version("C")`, since: sinceNever, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return rational.New(ctx, x).Version("C").Done()
		}), gomlxError: "invalid BroadcastTensorToShape"},
		{name: `rational Version("C") WithInitialValues`, since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return rational.New(ctx, x).Version("C").WithDegrees(2, 1).
				WithInitialValues(tensors.FromValue([]float32{0, 1, 0.1}), tensors.FromValue([]float32{1})).Done()
		})},
		{name: `rational Version("D") WithNoise`, since: sinceNew, noisy: true, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return rational.New(ctx, x).Version("D").WithNoise(0.1).Done()
		})},
		{name: "rational WithMultiplier", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return rational.New(ctx, x).WithMultiplier(true).WithMultiplierInitVariance(1).Done()
		})},
		{name: "rational Approximate", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return rational.New(ctx, x).Approximate("gelu").Done()
		})},
		{name: "rational WithInitialValues", since: sinceVerified, model: around(vecDims, func(ctx *context.Context, x *Node) *Node {
			return rational.New(ctx, x).WithDegrees(2, 1).
				WithInitialValues(tensors.FromValue([]float32{0, 1, 0.1}), tensors.FromValue([]float32{0.1})).Done()
		})},

		// vnn: layers of 3D vectors, equivariant to rotations.
		{name: "vnn.New", since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.New(ctx, x, 3).Done()
		})},
		{name: "vnn NumHiddenLayers", since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.New(ctx, x, 3).NumHiddenLayers(1, 4).Done()
		})},
		{name: `vnn Activation("none")`, since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.New(ctx, x, 3).NumHiddenLayers(1, 4).Activation("none").Done()
		})},
		{name: "vnn ActivationFn", since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.New(ctx, x, 3).NumHiddenLayers(1, 4).ActivationFn(func(ctx *context.Context, x *Node) *Node {
				return vnn.Relu(ctx, x).NegativeSlope(0.1).Done()
			}).Done()
		})},
		{name: "vnn Residual", since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.New(ctx, x, 4).NumHiddenLayers(2, 4).Residual(true).Done()
		})},
		{name: `vnn Normalization("layer")`, since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.New(ctx, x, 3).NumHiddenLayers(2, 4).Normalization("layer").Done()
		})},
		{name: "vnn Scaler", since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.New(ctx, x, 3).NumHiddenLayers(1, 4).Scaler(true).Done()
		})},
		{name: "vnn Regularizer", since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.New(ctx, x, 3).NumHiddenLayers(1, 4).Regularizer(regularizers.L2(0.01)).Done()
		})},
		{name: "vnn Dropout", since: sinceNever, gomlxError: "Where() requires the condition shape to be a prefix", model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.New(ctx, x, 3).NumHiddenLayers(2, 4).Dropout(0.3).Done()
		})},
		{name: "vnn.Relu", since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.Relu(ctx, x).Done()
		})},
		{name: "vnn.Relu ShareNonLinearity and NegativeSlope", since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.Relu(ctx, x).ShareNonLinearity(true).NegativeSlope(0.2).Done()
		})},
		{name: "vnn.ReluFromContext", since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.ReluFromContext(ctx, x)
		})},
		{name: "vnn.LayerNormalization", since: sinceVerified, model: around(vnnDims, func(_ *context.Context, x *Node) *Node {
			return vnn.LayerNormalization(x, 1e-5)
		})},
		{name: "vnn.DropoutNormalize", since: sinceNever, gomlxError: "Where() requires the condition shape to be a prefix", model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			return vnn.DropoutNormalize(ctx, x, f32(x.Graph(), 0.3), true)
		})},
		{name: "vnn.RotateOnOrigin", since: sinceVerified, model: around(vnnDims, func(_ *context.Context, x *Node) *Node {
			return vnn.RotateOnOrigin(x, f32(x.Graph(), 0.3), nil, f32(x.Graph(), -0.7))
		})},
		{name: "vnn.InvariantDotProduct", since: sinceVerified, model: around(vnnDims, func(ctx *context.Context, x *Node) *Node {
			v := vnn.New(ctx.In("v"), x, 3).NumHiddenLayers(0, 0).Done()
			w := vnn.New(ctx.In("w"), x, 3).NumHiddenLayers(0, 0).Done()
			return vnn.InvariantDotProduct(v, w)
		})},

		// Packages that do not compile into this module.
		{name: "kan", since: sinceNever, missing: kanMissing},
		{name: "bsplines.Evaluate", since: sinceNever, missing: kanMissing},
	}
	for _, activation := range activations.TypeValues() {
		since := sinceVerified
		switch activation {
		case activations.TypeRelu:
			since = "0.1.0"
		case activations.TypeGelu:
			since = "0.3.0"
		}
		rows = append(rows, layerRow{name: "activations.Apply(" + activation.String() + ")", since: since,
			model: around(vecDims, func(_ *context.Context, x *Node) *Node { return activations.Apply(activation, x) })})
	}
	return rows
}

// l1Amount is regularizers.L1's amount in its row: large enough that several weights start under it.
const l1Amount = 0.2

// kanMissing is why packages kan and bsplines are not covered: they import a module this one lacks.
const kanMissing = "GoMLX's kan and bsplines packages import github.com/gomlx/bsplines, which go.mod does not require"

// layerReport is what one process reports after training a row.
type layerReport struct {
	losses   []float64
	digest   [32]byte // the trainable parameters
	replicas error    // CheckReplicas: parameters, optimizer state and buffers
	still    []string // trainable parameters that did not move
	averages bool     // a batch normalization moving average moved
	check    error    // the row's own check
}

// trainLayerRow trains row's model on acc for layerSteps optimizer steps of the batch (x, y), then predicts.
func trainLayerRow(acc *accel.Accelerator, row layerRow, x, y *tensors.Tensor) (layerReport, error) {
	var rep layerReport
	model, err := acc.PrepareModel(context.New(), func(ctx *context.Context, in []*Node) []*Node {
		return []*Node{row.model(ctx, in[0])}
	}, testmodel.Loss)
	if err != nil {
		return rep, err
	}
	opt, err := acc.PrepareOptimizer(model, optimizers.Adam().LearningRate(0.01).Done())
	if err != nil {
		return rep, err
	}
	batch := batchOf(x, y)
	if err := model.Materialize(batch); err != nil {
		return rep, err
	}
	before, err := variableValues(model.Parameters())
	if err != nil {
		return rep, err
	}
	averagesBefore, err := variableValues(movingMeans(model.Context()))
	if err != nil {
		return rep, err
	}
	for step := range layerSteps {
		loss, err := acc.Backward(model, batch)
		if err != nil {
			return rep, fmt.Errorf("step %d: %w", step, err)
		}
		stepped, err := opt.Step()
		if err != nil {
			return rep, fmt.Errorf("step %d: %w", step, err)
		}
		if !stepped {
			return rep, fmt.Errorf("step %d: the optimizer did not step", step)
		}
		if err := opt.ZeroGrad(); err != nil {
			return rep, err
		}
		rep.losses = append(rep.losses, loss)
	}
	after, err := variableValues(model.Parameters())
	if err != nil {
		return rep, err
	}
	for name, values := range before {
		if slices.Equal(values, after[name]) {
			rep.still = append(rep.still, name)
		}
	}
	slices.Sort(rep.still)
	averagesAfter, err := variableValues(movingMeans(model.Context()))
	if err != nil {
		return rep, err
	}
	for name, values := range averagesBefore {
		if !slices.Equal(values, averagesAfter[name]) {
			rep.averages = true
		}
	}

	out, err := model.Predict(x)
	if err != nil {
		return rep, fmt.Errorf("Predict: %w", err)
	}
	if want := []int{x.Shape().Dim(0), testmodel.Classes}; !slices.Equal(out[0].Shape().Dimensions, want) {
		return rep, fmt.Errorf("Predict returned %s, want dimensions %v", out[0].Shape(), want)
	}
	for _, v := range tensors.MustCopyFlatData[float32](out[0]) {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return rep, fmt.Errorf("Predict returned %v", v)
		}
	}
	if rep.digest, err = replicas.VariablesDigest(model.Parameters()); err != nil {
		return rep, err
	}
	rep.replicas = acc.CheckReplicas(model)
	if row.check != nil {
		rep.check = row.check(model)
	}
	return rep, nil
}

// variableValues are the values of vars by scope and name.
func variableValues(vars []*context.Variable) (map[string][]float64, error) {
	values := map[string][]float64{}
	for _, v := range vars {
		flat, err := testmodel.FlatFloat64(v)
		if err != nil {
			return nil, err
		}
		values[v.ScopeAndName()] = flat
	}
	return values, nil
}

// movingMeans are the moving averages of the batch means that batch normalizations in ctx keep (in scope
// batch_normalization, or the layer's own with CurrentScope).
func movingMeans(ctx *context.Context) []*context.Variable {
	var vars []*context.Variable
	for v := range ctx.IterVariables() {
		if !v.Trainable && v.Name() == "mean" {
			vars = append(vars, v)
		}
	}
	return vars
}

// checkLayerReport asserts what every process of a row that trains reports.
func checkLayerReport(t *testing.T, row layerRow, rank int, rep layerReport) {
	t.Helper()
	require.Len(t, rep.losses, layerSteps, "rank %d", rank)
	for step, loss := range rep.losses {
		require.False(t, math.IsNaN(loss) || math.IsInf(loss, 0), "rank %d: loss %v at step %d", rank, loss, step)
	}
	first, last := rep.losses[0], rep.losses[layerSteps-1]
	if rank == 0 {
		t.Logf("loss %.4f → %.4f", first, last)
	}
	if row.noisy {
		assert.NotEqual(t, first, last, "rank %d: the loss did not change: %v", rank, rep.losses)
	} else {
		assert.Less(t, last, first, "rank %d: the loss did not fall: %v", rank, rep.losses)
	}
	assert.Empty(t, rep.still, "rank %d: trainable variables that did not move", rank)
	if row.averages {
		assert.True(t, rep.averages, "rank %d: batch normalization's moving averages did not move", rank)
	}
	assert.NoError(t, rep.check, "rank %d", rank)
}

// TestLayerCoverage trains every row of layerRows through the Accelerator, on 1 process and on 2 in-process
// ranks: no error, a finite loss that falls (changes, for rows that draw random numbers), every trainable
// variable moved, identical parameters on both ranks, and Predict runs. Rows that GoMLX v0.26.0 cannot
// build fail with GoMLX's own error on every rank.
func TestLayerCoverage(t *testing.T) {
	x, y := testmodel.Data(2*layerBatch, 41)
	for _, row := range layerRows() {
		t.Run(row.name, func(t *testing.T) {
			if row.missing != "" {
				checkLayerMissing(t, row)
				return
			}
			t.Run("1 process", func(t *testing.T) {
				acc := newSingle(t, accel.WithSeed(3))
				rep, err := trainLayerRow(acc, row, x, y)
				if row.gomlxError != "" {
					require.Error(t, err)
					assert.Contains(t, err.Error(), row.gomlxError)
					return
				}
				require.NoError(t, err)
				checkLayerReport(t, row, 0, rep)
				require.NoError(t, rep.replicas)
			})
			t.Run("2 processes", func(t *testing.T) {
				reports := make([]layerReport, 2)
				runRanks(t, 2, []accel.Option{accel.WithSeed(3)}, func(rank int, acc *accel.Accelerator) error {
					xr := testmodel.Rows(x, rank*layerBatch, (rank+1)*layerBatch)
					yr := testmodel.Rows(y, rank*layerBatch, (rank+1)*layerBatch)
					var err error
					reports[rank], err = trainLayerRow(acc, row, xr, yr)
					if row.gomlxError != "" {
						if err == nil || !strings.Contains(err.Error(), row.gomlxError) {
							return fmt.Errorf("want GoMLX's error %q, got %v", row.gomlxError, err)
						}
						return nil
					}
					return err
				})
				if row.gomlxError != "" {
					return
				}
				for rank, rep := range reports {
					checkLayerReport(t, row, rank, rep)
				}
				assert.Equal(t, reports[0].digest, reports[1].digest, "the ranks' parameters differ")
				// The optimizer's state and batch normalization's moving averages too (rank 0's by default).
				for rank, rep := range reports {
					assert.NoError(t, rep.replicas, "rank %d: CheckReplicas", rank)
				}
			})
		})
	}
}

// checkLayerMissing checks, where it can, why a row cannot be used through goaccel.
func checkLayerMissing(t *testing.T, row layerRow) {
	t.Helper()
	if row.missing != kanMissing {
		t.Logf("not covered: %s", row.missing)
		return
	}
	mod, err := os.ReadFile("../go.mod")
	require.NoError(t, err)
	require.NotContains(t, string(mod), "github.com/gomlx/bsplines",
		"go.mod now requires github.com/gomlx/bsplines: give kan and bsplines rows that train")
}

// TestLayerRowsAreDocumented: docs/layers.md's table has a line for every row of layerRows, saying
// whether it trains on 1 and on 2 processes and since which release, as the test does.
func TestLayerRowsAreDocumented(t *testing.T) {
	f, err := os.Open("../docs/layers.md")
	require.NoError(t, err)
	defer f.Close()
	documented := map[string][]string{}
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		documented[strings.Trim(cells[0], "`")] = cells
	}
	require.NoError(t, scanner.Err())
	for _, row := range layerRows() {
		cells, ok := documented[row.name]
		if !assert.True(t, ok, "docs/layers.md has no line for %q", row.name) {
			continue
		}
		if !assert.GreaterOrEqual(t, len(cells), 5, "docs/layers.md's line for %q", row.name) {
			continue
		}
		trains := "no"
		if row.trains() {
			trains = "yes"
		}
		assert.Equal(t, trains, cells[1], "docs/layers.md: does %q train on 1 process", row.name)
		assert.Equal(t, trains, cells[2], "docs/layers.md: does %q train on 2 processes", row.name)
		assert.Equal(t, row.since, cells[3], "docs/layers.md: since when %q trains", row.name)
	}
}
