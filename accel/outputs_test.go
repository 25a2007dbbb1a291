package accel_test

import (
	"testing"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/prepare"
)

// meanAbsError is an in-graph training metric.
func meanAbsError(_ *context.Context, labels, predictions []*Node) []*Node {
	return []*Node{ReduceAllMean(Abs(Sub(predictions[0], labels[0])))}
}

// TestBackwardOutputsAndMetrics: Backward returns the predictions and metrics of the forward pass it
// trains on — x·w at the weights before the micro-batch, computed by hand — and asking for them changes
// neither the loss nor the weights.
func TestBackwardOutputsAndMetrics(t *testing.T) {
	const k = 2
	for _, ranks := range []int{1, 2} {
		n := ranks * confBatch * 2 * k
		runRanks(t, ranks, []accel.Option{accel.WithGradientAccumulationSteps(k)}, func(rank int, acc *accel.Accelerator) error {
			src, err := linSource(n, 0, 0)
			require.NoError(t, err)
			var weights [2][]float64
			for i, withOutputs := range []bool{false, true} {
				ctx := context.New()
				model, err := acc.PrepareModel(ctx, linearModel(0, false), losses.MeanSquaredError, prepare.TrainMetrics(meanAbsError))
				require.NoError(t, err)
				opt, err := acc.PrepareOptimizer(model, optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(confLR))
				require.NoError(t, err)
				loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(confBatch))
				require.NoError(t, err)
				first, err := loader.PeekBatch()
				require.NoError(t, err)
				require.NoError(t, model.Materialize(first))
				for batch, err := range loader.All() {
					require.NoError(t, err)
					w, err := flatVariable(ctx, "/linear", "w")
					require.NoError(t, err)
					require.NoError(t, acc.Accumulate(func() error {
						var outputs, metrics []*tensors.Tensor
						var opts []accel.BackwardOption
						if withOutputs {
							opts = append(opts, accel.Outputs(&outputs), accel.Metrics(&metrics))
						}
						loss, err := acc.Backward(model, batch, opts...)
						if err != nil {
							return err
						}
						var wantLoss, wantMAE float64
						wantPred := make([]float64, len(batch.Indices))
						for j, idx := range batch.Indices {
							x, y := linExample(idx)
							wantPred[j] = x[0]*w[0] + x[1]*w[1]
							wantLoss += (wantPred[j] - y) * (wantPred[j] - y) / float64(len(batch.Indices))
							wantMAE += abs(wantPred[j]-y) / float64(len(batch.Indices))
						}
						assert.InDelta(t, wantLoss, loss, confTol)
						if withOutputs {
							require.Len(t, outputs, 1)
							assert.InDeltaSlice(t, wantPred, tensors.MustCopyFlatData[float64](outputs[0]), confTol)
							require.Len(t, metrics, 1)
							assert.InDelta(t, wantMAE, tensors.ToScalar[float64](metrics[0]), confTol)
						}
						if _, err := opt.Step(); err != nil {
							return err
						}
						return opt.ZeroGrad()
					}))
				}
				weights[i], err = flatVariable(ctx, "/linear", "w")
				require.NoError(t, err)
			}
			assert.Equal(t, weights[0], weights[1], "rank %d: outputs must not change training", rank)
			return nil
		})
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
