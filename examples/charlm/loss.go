package main

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// nextByteLoss is the mean cross-entropy of logits [b, T, V] against the next bytes, labels [b, T, 1]:
// at each position log Σ_v exp(logit_v) − logit_label. It is losses.SparseCategoricalCrossEntropyLogits
// without that function's one-hot: GoMLX builds the labels as a [b, T, V] float tensor (an Equal of
// every label against every byte value) and multiplies the log-probabilities by it in the forward and the
// backward pass: three full passes over the logits (docs/notes.md, Note [the one-hot loss]). Here
// the label's logit is picked by a Gather, whose gradient is a scatter of one value per position; the
// log-sum-exp is shifted by the row's maximum, as LogSoftmax is, so large logits do not overflow.
func nextByteLoss(labels, logits []*Node) *Node {
	if len(labels) != 1 || len(logits) != 1 {
		panic(fmt.Errorf("charlm: the loss takes one label and one logits tensor, got %d and %d", len(labels), len(logits)))
	}
	x, y := logits[0], labels[0]
	rank := x.Rank()
	if rank < 1 || y.Rank() != rank || y.Shape().Dimensions[rank-1] != 1 || !y.DType().IsInt() {
		panic(fmt.Errorf("charlm: labels %s do not match logits %s (want integer labels [..., 1])", y.Shape(), x.Shape()))
	}
	g := x.Graph()
	vocab := x.Shape().Dimensions[rank-1]
	rows := x.Shape().Size() / vocab
	x = Reshape(x, rows, vocab)
	maxes := StopGradient(ReduceAndKeep(x, ReduceMax, -1))
	logSumExp := Add(Log(ReduceSum(Exp(Sub(x, maxes)), -1)), Reshape(maxes, rows))
	// Row r's label v is element r·V + v of the flattened logits.
	flatIndex := Add(MulScalar(Iota(g, shapes.Make(dtypes.Int32, rows), 0), float64(vocab)),
		ConvertDType(Reshape(y, rows), dtypes.Int32))
	picked := Gather(Reshape(x, rows*vocab), InsertAxes(flatIndex, -1))
	return ReduceAllMean(Sub(logSumExp, picked))
}
