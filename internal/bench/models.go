package bench

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/prepare"
)

// mlp describes a dense classifier: Inputs features, one Dense layer (weights and biases) per entry of
// Hidden with a tanh after each, and a final Dense layer to Classes logits. One description serves as a
// GoMLX model and as the parameter list gradient buckets are planned for, so the measurements of bucketing
// and of training see the same tensors.
//
// With Vocab > 0 the inputs are Tokens token ids per example instead, embedded in Inputs dimensions and
// averaged (a bag-of-words text classifier): a large embedding table whose gradient is a cheap scatter.
type mlp struct {
	Inputs, Classes int
	Hidden          []int
	Vocab, Tokens   int `json:",omitempty"`
}

// widths are the output widths of every Dense layer, in order.
func (m mlp) widths() []int { return append(append([]int(nil), m.Hidden...), m.Classes) }

// params lists the trainable tensors in registration order, named and shaped as layers.Dense creates them.
func (m mlp) params() []accumulate.Param {
	var params []accumulate.Param
	if m.Vocab > 0 {
		params = append(params, accumulate.Param{Name: "/embedding/embeddings",
			Shape: shapes.Make(dtypes.Float32, m.Vocab, m.Inputs)})
	}
	in := m.Inputs
	for i, out := range m.widths() {
		scope := fmt.Sprintf("/layer_%03d", i)
		params = append(params,
			accumulate.Param{Name: scope + "/weights", Shape: shapes.Make(dtypes.Float32, in, out)},
			accumulate.Param{Name: scope + "/biases", Shape: shapes.Make(dtypes.Float32, out)})
		in = out
	}
	return params
}

// bytes is the size of all parameters, and so of one full set of float32 gradients.
func (m mlp) bytes() int64 { return paramBytes(m.params()) }

// paramBytes is the size of params.
func paramBytes(params []accumulate.Param) int64 {
	var n int64
	for _, p := range params {
		n += int64(p.Shape.Memory())
	}
	return n
}

// describe says what the model is: "102 gradient tensors, 21.9 MB: MLP 256→448→192→…→192→10 (51 layers)".
func (m mlp) describe() string {
	return fmt.Sprintf("%d gradient tensors, %.1f MB: %s", len(m.params()), float64(m.bytes())/(1<<20), m.shortName())
}

// shortName is "MLP 784→128→10" or "bag-of-words 65536×32, 32→64→10"; long chains are elided in the middle.
func (m mlp) shortName() string {
	widths := append([]int{m.Inputs}, m.widths()...)
	parts := make([]string, len(widths))
	for i, w := range widths {
		parts[i] = fmt.Sprint(w)
	}
	chain := strings.Join(parts, "→")
	if len(parts) > 6 {
		chain = fmt.Sprintf("%s→…→%s (%d layers)", strings.Join(parts[:3], "→"), strings.Join(parts[len(parts)-2:], "→"),
			len(parts)-1)
	}
	if m.Vocab > 0 {
		return fmt.Sprintf("bag-of-words %d×%d, %s", m.Vocab, m.Inputs, chain)
	}
	return "MLP " + chain
}

// modelFn is the GoMLX model function.
func (m mlp) modelFn(ctx *context.Context, inputs []*Node) []*Node {
	x := inputs[0]
	if m.Vocab > 0 {
		// [batch, tokens] ids → [batch, tokens, Inputs] → mean over the tokens.
		x = ReduceMean(layers.Embedding(ctx.In("embedding"), x, dtypes.Float32, m.Vocab, m.Inputs), 1)
	}
	widths := m.widths()
	for i, out := range widths {
		x = layers.Dense(ctx.In(fmt.Sprintf("layer_%03d", i)), x, true, out)
		if i < len(widths)-1 {
			x = Tanh(x)
		}
	}
	return []*Node{x}
}

// loss is the mean sparse cross-entropy on logits.
func loss(labels, predictions []*Node) *Node {
	return losses.SparseCategoricalCrossEntropyLogits(labels, predictions)
}

// batches returns n synthetic batches of batchSize examples: normal inputs and uniform labels. The
// numbers do not matter for timing, but they are deterministic and finite.
func (m mlp) batches(n, batchSize int, seed uint64) []prepare.Batch {
	rng := rand.New(rand.NewPCG(seed, 5))
	out := make([]prepare.Batch, n)
	for i := range out {
		var inputs *tensors.Tensor
		if m.Vocab > 0 {
			ids := make([]int32, batchSize*m.Tokens)
			for j := range ids {
				ids[j] = int32(rng.IntN(m.Vocab))
			}
			inputs = tensors.FromFlatDataAndDimensions(ids, batchSize, m.Tokens)
		} else {
			x := make([]float32, batchSize*m.Inputs)
			for j := range x {
				x[j] = float32(rng.NormFloat64())
			}
			inputs = tensors.FromFlatDataAndDimensions(x, batchSize, m.Inputs)
		}
		y := make([]int32, batchSize)
		for j := range y {
			y[j] = int32(rng.IntN(m.Classes))
		}
		out[i] = prepare.Batch{
			Inputs: []*tensors.Tensor{inputs},
			Labels: []*tensors.Tensor{tensors.FromFlatDataAndDimensions(y, batchSize, 1)},
			Valid:  batchSize, Step: i,
		}
	}
	return out
}
