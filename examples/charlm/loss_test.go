package main

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
)

// TestNextByteLossMatchesGoMLX holds the gather-based loss to GoMLX's one-hot sparse cross-entropy, value
// and gradient, on logits large enough to overflow an unshifted exp.
func TestNextByteLossMatchesGoMLX(t *testing.T) {
	acc, err := accel.New()
	require.NoError(t, err)
	defer func() { require.NoError(t, acc.Close()) }()
	lossAndGradient := func(loss func(labels, logits []*graph.Node) *graph.Node) func(logits, labels *graph.Node) []*graph.Node {
		return func(logits, labels *graph.Node) []*graph.Node {
			value := loss([]*graph.Node{labels}, []*graph.Node{logits})
			return []*graph.Node{value, graph.Gradient(value, logits)[0]}
		}
	}
	ours := graph.MustNewExec(acc.Backend(), lossAndGradient(nextByteLoss))
	gomlx := graph.MustNewExec(acc.Backend(), lossAndGradient(losses.SparseCategoricalCrossEntropyLogits))
	for _, c := range []struct {
		name         string
		dims         []int // logits; labels are dims[:-1] + [1]
		logitScale   float32
		wantGradDiff float64
	}{
		{"one window", []int{1, 7, vocabSize}, 3, 1e-7},
		{"batch of windows", []int{4, 16, vocabSize}, 3, 1e-7},
		{"large logits", []int{2, 5, vocabSize}, 200, 1e-6},
		{"small vocabulary", []int{3, 2, 5}, 1, 1e-6},
	} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(len(c.dims)), uint64(c.dims[1])))
			vocab := c.dims[len(c.dims)-1]
			logits := make([]float32, c.dims[0]*c.dims[1]*vocab)
			for i := range logits {
				logits[i] = c.logitScale * (2*rng.Float32() - 1)
			}
			labels := make([]int32, c.dims[0]*c.dims[1])
			for i := range labels {
				labels[i] = int32(rng.IntN(vocab))
			}
			logitsT := tensors.FromFlatDataAndDimensions(logits, c.dims...)
			labelsT := tensors.FromFlatDataAndDimensions(labels, c.dims[0], c.dims[1], 1)
			got, want := ours.MustExec(logitsT, labelsT), gomlx.MustExec(logitsT, labelsT)
			assert.InDelta(t, want[0].Value().(float32), got[0].Value().(float32), 1e-5*float64(c.logitScale))
			wantGrad, gotGrad := tensors.MustCopyFlatData[float32](want[1]), tensors.MustCopyFlatData[float32](got[1])
			require.Len(t, gotGrad, len(wantGrad))
			for i := range wantGrad {
				require.InDelta(t, wantGrad[i], gotGrad[i], c.wantGradDiff, "gradient element %d", i)
			}
		})
	}
}

func TestNextByteLossRefusesMismatchedLabels(t *testing.T) {
	acc, err := accel.New()
	require.NoError(t, err)
	defer func() { require.NoError(t, acc.Close()) }()
	exec := graph.MustNewExec(acc.Backend(), func(logits, labels *graph.Node) *graph.Node {
		return nextByteLoss([]*graph.Node{labels}, []*graph.Node{logits})
	})
	logits := tensors.FromShape(tensors.FromValue([][]float32{{0, 1}}).Shape())
	_, err = exec.Exec(logits, tensors.FromValue([]int32{1}))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "do not match logits")
}

// TestGeluMatchesGoMLX holds gelu to GoMLX's Gelu: the same values, and the gradient within float32
// rounding of GoMLX's operation-by-operation one, on activations of the sizes a transformer's MLP sees.
func TestGeluMatchesGoMLX(t *testing.T) {
	acc, err := accel.New()
	require.NoError(t, err)
	defer func() { require.NoError(t, acc.Close()) }()
	valueAndGradient := func(f func(*graph.Node) *graph.Node) func(x, weights *graph.Node) []*graph.Node {
		return func(x, weights *graph.Node) []*graph.Node {
			y := f(x)
			return []*graph.Node{y, graph.Gradient(graph.ReduceAllSum(graph.Mul(y, weights)), x)[0]}
		}
	}
	ours := graph.MustNewExec(acc.Backend(), valueAndGradient(gelu))
	gomlx := graph.MustNewExec(acc.Backend(), valueAndGradient(activations.Gelu))
	rng := rand.New(rand.NewPCG(7, 11))
	const n = 3 * 1024
	x, weights := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i] = 8 * (2*rng.Float32() - 1) // far into both tails
		weights[i] = 2*rng.Float32() - 1
	}
	x[0], x[1] = 0, -30
	xT, wT := tensors.FromFlatDataAndDimensions(x, 3, 1024), tensors.FromFlatDataAndDimensions(weights, 3, 1024)
	got, want := ours.MustExec(xT, wT), gomlx.MustExec(xT, wT)
	assert.Equal(t, tensors.MustCopyFlatData[float32](want[0]), tensors.MustCopyFlatData[float32](got[0]), "values")
	wantGrad, gotGrad := tensors.MustCopyFlatData[float32](want[1]), tensors.MustCopyFlatData[float32](got[1])
	for i := range wantGrad {
		require.InDelta(t, wantGrad[i], gotGrad[i], 1e-6+1e-6*math.Abs(float64(wantGrad[i])), "gradient at x = %g", x[i])
	}
}
