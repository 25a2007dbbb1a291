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

// MLP describes a dense classifier: Inputs features, one Dense layer (weights and biases) per entry of
// Hidden with a tanh after each, and a final Dense layer to Classes logits. One description serves as a
// GoMLX model (Model) and as the parameter list the gradient buckets are planned for (Params), so the
// measurements of bucketing and of training see the same tensors.
//
// With Vocab > 0 the inputs are Tokens token ids per example instead, embedded in Inputs dimensions and
// averaged (a bag-of-words text classifier). Its embedding table is large but cheap to train: its gradient
// costs a scatter into a zeroed table, not a matrix product, which makes it the model where communication
// is a visible share of a training step on the pure-Go backend.
type MLP struct {
	Inputs  int   `json:"inputs"`
	Hidden  []int `json:"hidden"`
	Classes int   `json:"classes"`
	Vocab   int   `json:"vocab,omitempty"`
	Tokens  int   `json:"tokens,omitempty"`
}

// widths are the output widths of every Dense layer, in order.
func (m MLP) widths() []int { return append(append([]int(nil), m.Hidden...), m.Classes) }

// Params lists the trainable tensors in registration order, named and shaped as layers.Dense creates
// them.
func (m MLP) Params() []accumulate.Param {
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

// Bytes is the size of all parameters (and so of one full set of float32 gradients).
func (m MLP) Bytes() int64 {
	var n int64
	for _, p := range m.Params() {
		n += int64(p.Shape.Memory())
	}
	return n
}

// Describe says what the model is: "102 gradient tensors, 21.9 MB: 51 Dense layers 256→448→…→10".
func (m MLP) Describe() string {
	layers := fmt.Sprintf("%d Dense layers %s", len(m.widths()), m.chain())
	if m.Vocab > 0 {
		layers = fmt.Sprintf("a %d×%d embedding averaged over %d tokens, then %s", m.Vocab, m.Inputs, m.Tokens, layers)
	}
	return fmt.Sprintf("%d gradient tensors, %.1f MB: %s", len(m.Params()), float64(m.Bytes())/(1<<20), layers)
}

// chain is the layer widths, "256→448→192→10", elided in the middle when long.
func (m MLP) chain() string {
	widths := append([]int{m.Inputs}, m.widths()...)
	if len(widths) > 6 {
		return fmt.Sprintf("%d→%d→%d→…→%d→%d", widths[0], widths[1], widths[2], widths[len(widths)-2], widths[len(widths)-1])
	}
	parts := make([]string, len(widths))
	for i, w := range widths {
		parts[i] = fmt.Sprint(w)
	}
	return strings.Join(parts, "→")
}

// Model is the GoMLX model function.
func (m MLP) Model(ctx *context.Context, inputs []*Node) []*Node {
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

// Loss is the mean sparse cross-entropy on logits.
func Loss(labels, predictions []*Node) *Node {
	return losses.SparseCategoricalCrossEntropyLogits(labels, predictions)
}

// Batches returns n synthetic batches of batchSize examples for the model: normal inputs and uniform
// labels. The numbers do not matter for timing, but they are deterministic and finite.
func (m MLP) Batches(n, batchSize int, seed uint64) []prepare.Batch {
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
