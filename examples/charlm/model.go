package main

import (
	"fmt"
	"math"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"

	"github.com/goaccel/goaccel/prepare"
)

// architecture is the transformer's shape.
type architecture struct {
	context, dModel, heads, blocks int
}

// Initialisation and normalisation constants shared with the PyTorch twin (internal/bench/pytorch/charlm_ddp.py).
const (
	// initStddev is GPT-2's: every weight matrix and embedding starts as N(0, 0.02²), biases at zero.
	initStddev = 0.02
	// layerNormEpsilon is PyTorch's default (GoMLX's is 1e-3).
	layerNormEpsilon = 1e-5
	// mlpExpansion is the MLP's hidden width over the model width.
	mlpExpansion = 4
)

// normalInitializer draws weights (rank ≥ 2) from N(0, initStddev²) with the context's random state and
// sets biases (rank ≤ 1) to zero. GoMLX's default He initialiser would give the query, key and value
// projections, shaped [d, heads, head_dim], a fan-in of d·heads: a convolution's rule, not a projection's.
func normalInitializer(ctx *context.Context) context.VariableInitializer {
	return func(g *Graph, shape shapes.Shape) *Node {
		if shape.Rank() <= 1 || !shape.DType.IsFloat() {
			return Zeros(g, shape)
		}
		return MulScalar(ctx.RandomNormal(g, shape), initStddev)
	}
}

// transformer returns the model function: byte and learned position embeddings, blocks of pre-LayerNorm
// causal multi-head self-attention and a GELU MLP, each added back to its input, then a final LayerNorm
// and a projection to one logit per byte value. The input is int32 bytes [b, T] with T ≤ context; the
// output logits [b, T, 256].
func transformer(arch architecture) prepare.ModelFn {
	return func(ctx *context.Context, inputs []*Node) []*Node {
		ctx = ctx.WithInitializer(normalInitializer(ctx))
		tokens := inputs[0]
		g := tokens.Graph()
		batch, length := tokens.Shape().Dimensions[0], tokens.Shape().Dimensions[1]
		if length > arch.context {
			panic(fmt.Errorf("charlm: a sequence of %d bytes is longer than the model's context of %d", length, arch.context))
		}
		x := layers.Embedding(ctx.In("token_embedding"), tokens, dtypes.Float32, vocabSize, arch.dModel)
		// Learned positions are an embedding of 0…T−1: its gradient is a scatter-add, where slicing a table
		// would need a Pad in the backward pass, which the pure-Go backend lacks.
		positions := layers.Embedding(ctx.In("position_embedding"), Iota(g, shapes.Make(dtypes.Int32, length), 0),
			dtypes.Float32, arch.context, arch.dModel, true)
		x = Add(x, BroadcastToDims(InsertAxes(positions, 0), batch, length, arch.dModel))
		for i := range arch.blocks {
			block := ctx.In(fmt.Sprintf("block%d", i))
			h := layerNorm(block.In("attention_norm"), x)
			h = layers.MultiHeadAttention(block.In("attention"), h, h, h, arch.heads, arch.dModel/arch.heads).
				UseCausalMask().Done()
			x = Add(x, h)
			h = layerNorm(block.In("mlp_norm"), x)
			h = gelu(layers.Dense(block.In("mlp_in"), h, true, mlpExpansion*arch.dModel))
			x = Add(x, layers.Dense(block.In("mlp_out"), h, true, arch.dModel))
		}
		x = layerNorm(ctx.In("final_norm"), x)
		return []*Node{layers.Dense(ctx.In("output"), x, true, vocabSize)}
	}
}

// gelu is activations.Gelu, x·Φ(x) with Φ the standard normal distribution's CDF, with its gradient
// written as one expression of x: Φ(x) + x·φ(x), φ the distribution's density. Differentiated operation
// by operation, GoMLX's Gelu keeps x/√2 and Φ(x) from the forward pass as tensors of their own (each is
// read twice, so neither can join a fused chain) and takes the cotangent through two more passes of its
// own; here the forward pass is one fused chain and the backward pass another, both reading x alone.
// The forward value is Gelu's, plus x − x (zero for any finite x): what carries the gradient.
func gelu(x *Node) *Node {
	value := StopGradient(activations.Gelu(x))
	carrier := IdentityWithCustomGradient(x, func(_, cotangent *Node) *Node {
		return Mul(cotangent, geluDerivative(x))
	})
	return Add(value, Sub(carrier, StopGradient(x)))
}

// geluDerivative is dGELU/dx = Φ(x) + x·φ(x).
func geluDerivative(x *Node) *Node {
	cdf := MulScalar(OnePlus(Erf(MulScalar(x, 1/math.Sqrt2))), 0.5)
	density := MulScalar(Exp(MulScalar(Square(x), -0.5)), 1/math.Sqrt(2*math.Pi))
	return Add(cdf, Mul(x, density))
}

// layerNorm normalises over the feature axis, with a learned gain and offset.
func layerNorm(ctx *context.Context, x *Node) *Node {
	return layers.LayerNormalization(ctx, x, -1).Epsilon(layerNormEpsilon).Done()
}

// warmupCosine is the learning rate of each optimizer step: a linear warm-up from peak/warmup to peak over
// the first warmup steps, then a cosine decay to minLRFraction·peak at the last of total steps.
func warmupCosine(peak float64, warmup, total int64) prepare.Schedule {
	return func(step int64) float64 {
		if step < warmup {
			return peak * float64(step+1) / float64(warmup)
		}
		progress := min(float64(step-warmup)/float64(max(total-warmup, 1)), 1)
		return peak * (minLRFraction + (1-minLRFraction)*0.5*(1+math.Cos(math.Pi*progress)))
	}
}

// minLRFraction is where the cosine decay ends, as a fraction of the peak rate.
const minLRFraction = 0.1
