package accel_test

import (
	"fmt"
	"testing"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers/regularizers"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// sumLoss is a sum-reduced cross-entropy: the mean times the batch size.
func sumLoss(labels, predictions []*Node) *Node {
	mean := losses.SparseCategoricalCrossEntropyLogits(labels, predictions)
	return MulScalar(mean, float64(predictions[0].Shape().Dimensions[0]))
}

// TestLossScaleRecoversSumReducedLoss: averaging across N ranks and K micro-batches divides a sum-reduced
// loss's gradient by N·K; LossScale(N·K) gives back one process's sum over the N·K·b batch (docs/semantics.md §2).
// Without the scale the result differs, which is why the docs tell users about it.
func TestLossScaleRecoversSumReducedLoss(t *testing.T) {
	const b, steps = 2, 2
	for _, tc := range []struct{ ranks, k int }{{2, 1}, {2, 2}, {4, 1}} {
		t.Run(fmt.Sprintf("ranks=%d/K=%d", tc.ranks, tc.k), func(t *testing.T) {
			global := tc.ranks * tc.k * b
			inputs, labels := testmodel.Data(global*steps, 11)
			backend, err := cpu.New(cpu.Config{Backend: "go"})
			require.NoError(t, err)
			for _, scaled := range []bool{true, false} {
				results := make([]testmodel.Result, tc.ranks)
				run := testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: b, LossFn: sumLoss}
				if scaled {
					run.LossScale = float64(tc.ranks * tc.k)
				}
				runRanks(t, tc.ranks, []accel.Option{accel.WithGradientAccumulationSteps(tc.k)},
					func(rank int, acc *accel.Accelerator) error {
						var err error
						results[rank], err = run.Train(acc)
						return err
					})
				ref := results[0].Initial
				require.NoError(t, testmodel.ReferenceTrainWithLoss(backend, ref, testmodel.SGD, sumLoss,
					testmodel.ReferenceBatches(inputs, labels, global, 1)))
				worst, name, err := testmodel.MaxRelativeError(results[0].Model.Parameters(), ref)
				require.NoError(t, err)
				if scaled {
					assert.LessOrEqual(t, worst, 1e-5, name)
				} else {
					assert.Greater(t, worst, 1e-3, "without LossScale a sum-reduced loss is averaged away")
				}
			}
		})
	}
}

// TestRegularizersMatchTrainer: loss terms the model adds with train.AddLoss (here layers.Dense's L2 on its
// weights, from the regularizers.ParamL2 hyperparameter) are optimised as GoMLX's Trainer does: N ranks ×
// K micro-batches give the Trainer's weights on the N·K·b batch, and without the term they would not.
func TestRegularizersMatchTrainer(t *testing.T) {
	const b, steps, l2 = 2, 3, 0.5
	backend, err := cpu.New(cpu.Config{Backend: "go"})
	require.NoError(t, err)
	for _, tc := range []struct{ ranks, k int }{{1, 1}, {1, 2}, {2, 2}} {
		t.Run(fmt.Sprintf("ranks=%d/K=%d", tc.ranks, tc.k), func(t *testing.T) {
			global := tc.ranks * tc.k * b
			inputs, labels := testmodel.Data(global*steps, 13)
			results := make([]testmodel.Result, tc.ranks)
			run := testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: b, L2: l2}
			runRanks(t, tc.ranks, []accel.Option{accel.WithGradientAccumulationSteps(tc.k)},
				func(rank int, acc *accel.Accelerator) error {
					var err error
					results[rank], err = run.Train(acc)
					return err
				})
			batches := testmodel.ReferenceBatches(inputs, labels, global, 1)
			ref := results[0].Initial
			ref.SetParam(regularizers.ParamL2, l2)
			require.NoError(t, testmodel.ReferenceTrain(backend, ref, testmodel.SGD, batches))
			worst, name, err := testmodel.MaxRelativeError(results[0].Model.Parameters(), ref)
			require.NoError(t, err)
			assert.LessOrEqual(t, worst, 1e-5, name)

			unregularized := context.New()
			require.NoError(t, testmodel.CopyParams(unregularized, allVariables(results[0].Initial)))
			require.NoError(t, testmodel.ReferenceTrain(backend, unregularized, testmodel.SGD, batches))
			worst, _, err = testmodel.MaxRelativeError(results[0].Model.Parameters(), unregularized)
			require.NoError(t, err)
			assert.Greater(t, worst, 1e-3, "the L2 term must change the result")
		})
	}
}
