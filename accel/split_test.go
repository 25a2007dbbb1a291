package accel_test

import (
	"fmt"
	"testing"

	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/prepare"
)

// TestSplitBatches: with WithSplitBatches the batch size is global: N ranks each take 1/N of it, every
// step covers the same examples whatever N, and the weights are the hand-computed ones of one process on
// the global batch.
func TestSplitBatches(t *testing.T) {
	const global, steps = 4, 3
	for _, ranks := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			weights := make([][]float64, ranks)
			runRanks(t, ranks, []accel.Option{accel.WithSplitBatches()}, func(rank int, acc *accel.Accelerator) error {
				src, err := linSource(global*steps, 0, 0)
				require.NoError(t, err)
				ctx := context.New()
				p, err := acc.Prepare(accel.Spec{Context: ctx, Model: linearModel(0, false), Loss: losses.MeanSquaredError,
					Optimizer: optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(confLR),
					Loaders:   []accel.LoaderSpec{{Source: src, Options: []prepare.LoaderOption{prepare.BatchSize(global)}}}})
				if err != nil {
					return err
				}
				assert.Equal(t, global/ranks, p.Loaders[0].BatchSize())
				assert.Equal(t, steps, p.Loaders[0].Len())
				for batch, err := range p.Loaders[0].All() {
					if err != nil {
						return err
					}
					assert.Len(t, batch.Indices, global/ranks)
					if _, err := acc.Backward(p.Model, batch); err != nil {
						return err
					}
					if _, err := p.Optimizer.Step(); err != nil {
						return err
					}
					if err := p.Optimizer.ZeroGrad(); err != nil {
						return err
					}
				}
				weights[rank], err = flatVariable(ctx, "/linear", "w")
				return err
			})
			chunks := [][2]int{{0, 4}, {4, 8}, {8, 12}}
			for r := range ranks {
				assertWeights(t, linSGD(chunks, constantLRs(steps), 0), weights[r], "rank %d", r)
			}
		})
	}
}

func TestSplitBatchesRejectsIndivisibleSizes(t *testing.T) {
	runRanks(t, 2, []accel.Option{accel.WithSplitBatches()}, func(rank int, acc *accel.Accelerator) error {
		src, err := linSource(12, 0, 0)
		require.NoError(t, err)
		_, err = acc.PrepareDataLoader(src, prepare.BatchSize(3))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "global batch size 3 does not divide by the 2 processes")
		return nil
	})
}
