package accel_test

import (
	"fmt"
	"testing"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/prepare"
	"github.com/goaccel/goaccel/schedule"
)

func TestPrepareRejectsIncompleteSpecs(t *testing.T) {
	src, err := linSource(4, 0, 0)
	require.NoError(t, err)
	sgd := optimizers.StochasticGradientDescent()
	for _, tc := range []struct {
		name string
		spec accel.Spec
		want string
	}{
		{"no model", accel.Spec{Loss: losses.MeanSquaredError}, "no model function"},
		{"no loss", accel.Spec{Model: linearModel(0, false)}, "no loss function"},
		{"schedule without optimizer", accel.Spec{Model: linearModel(0, false), Loss: losses.MeanSquaredError,
			Schedule: halvingRate}, "schedule needs an optimizer"},
		{"loader without source", accel.Spec{Model: linearModel(0, false), Loss: losses.MeanSquaredError, Optimizer: sgd,
			Loaders: []accel.LoaderSpec{{Source: src}, {}}}, "loader 1 has no source"},
		{"sized schedule without epochs", accel.Spec{Model: linearModel(0, false), Loss: losses.MeanSquaredError, Optimizer: sgd,
			SizedSchedule: schedule.Cosine(0.1, 2), Loaders: []accel.LoaderSpec{{Source: src}}}, "needs the number of epochs"},
		{"sized schedule without loader", accel.Spec{Model: linearModel(0, false), Loss: losses.MeanSquaredError, Optimizer: sgd,
			SizedSchedule: schedule.Cosine(0.1, 2), Epochs: 2}, "needs a loader"},
		{"both schedules", accel.Spec{Model: linearModel(0, false), Loss: losses.MeanSquaredError, Optimizer: sgd,
			Schedule: halvingRate, SizedSchedule: schedule.Cosine(0.1, 2), Epochs: 2}, "not both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acc := newSingle(t)
			_, err := acc.Prepare(tc.spec)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, acc.Models(), "a refused spec prepares nothing")
		})
	}
}

// TestPrepareEqualsPreparingOneByOne: Prepare's objects train exactly as the ones PrepareModel,
// PrepareOptimizer, PrepareScheduler and PrepareDataLoader make, on 1 and 2 ranks, to the hand-computed
// weights of two steps at the scheduled rates.
func TestPrepareEqualsPreparingOneByOne(t *testing.T) {
	const k = 2
	for _, ranks := range []int{1, 2} {
		n := ranks * confBatch * 2 * k
		weights := make([][]float64, ranks)
		runRanks(t, ranks, []accel.Option{accel.WithGradientAccumulationSteps(k)}, func(rank int, acc *accel.Accelerator) error {
			src, err := linSource(n, 0, 0)
			require.NoError(t, err)
			ctx := context.New()
			p, err := acc.Prepare(accel.Spec{Context: ctx, Model: linearModel(0, false), Loss: losses.MeanSquaredError,
				Optimizer: optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(confLR),
				Schedule:  halvingRate,
				Loaders:   []accel.LoaderSpec{{Source: src, Options: []prepare.LoaderOption{prepare.BatchSize(confBatch)}}}})
			if err != nil {
				return err
			}
			require.Len(t, p.Loaders, 1)
			assert.Equal(t, []*prepare.Model{p.Model}, acc.Models())
			assert.Equal(t, []*prepare.Optimizer{p.Optimizer}, acc.Optimizers())
			for batch, err := range p.Loaders[0].All() {
				if err != nil {
					return err
				}
				err = acc.Accumulate(func() error {
					if _, err := acc.Backward(p.Model, batch); err != nil {
						return err
					}
					if _, err := p.Optimizer.Step(); err != nil {
						return err
					}
					return p.Optimizer.ZeroGrad()
				})
				if err != nil {
					return err
				}
			}
			weights[rank], err = flatVariable(ctx, "/linear", "w")
			return err
		})
		want := linSGD(linChunks(ranks, k, 2*k, 1), []float64{halvingRate(0), halvingRate(1)}, 0)
		for r := range ranks {
			assertWeights(t, want, weights[r], "ranks=%d rank %d", ranks, r)
		}
	}
}

// TestFromTrainModelFn: a GoMLX train.ModelFn, spec argument included, trains through the adapter to the
// same weights as the goaccel model function it wraps.
func TestFromTrainModelFn(t *testing.T) {
	var specs []any
	trainFn := train.ModelFn(func(ctx *context.Context, spec any, inputs []*Node) []*Node {
		specs = append(specs, spec)
		return linearModel(0, false)(ctx, inputs)
	})
	require.Nil(t, prepare.FromTrainModelFn(nil, nil))
	acc := newSingle(t, accel.WithGradientAccumulationSteps(2))
	src, err := linSource(8, 0, 0)
	require.NoError(t, err)
	ctx := context.New()
	p, err := acc.Prepare(accel.Spec{Context: ctx, Model: prepare.FromTrainModelFn(trainFn, "my spec"),
		Loss:      losses.MeanSquaredError,
		Optimizer: optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(confLR),
		Loaders:   []accel.LoaderSpec{{Source: src, Options: []prepare.LoaderOption{prepare.BatchSize(confBatch)}}}})
	require.NoError(t, err)
	for batch, err := range p.Loaders[0].All() {
		require.NoError(t, err)
		require.NoError(t, acc.Accumulate(func() error {
			if _, err := acc.Backward(p.Model, batch); err != nil {
				return err
			}
			if _, err := p.Optimizer.Step(); err != nil {
				return err
			}
			return p.Optimizer.ZeroGrad()
		}))
	}
	w, err := flatVariable(ctx, "/linear", "w")
	require.NoError(t, err)
	assertWeights(t, linSGD(linChunks(1, 2, 4, 1), constantLRs(2), 0), w)
	require.NotEmpty(t, specs)
	for _, s := range specs {
		assert.Equal(t, "my spec", s)
	}
}

// TestSizedScheduleFollowsTheJob: a schedule sized by the prepared job spans its real number of optimizer
// steps — 16 examples, batches of 2 per process, K = 2, 3 epochs: 12 steps on 1 process, 6 on 2 (each
// process has half the batches) — and gives every step the rate worked out by hand for that total
// (cosine, peak 0.1, 2 warm-up steps).
func TestSizedScheduleFollowsTheJob(t *testing.T) {
	want := map[int][]float64{
		1: {0, 0.05, 0.1, 0.0975528258, 0.0904508497, 0.0793892626, 0.0654508497, 0.05, 0.0345491503, 0.0206107374,
			0.0095491503, 0.0024471742},
		2: {0, 0.05, 0.1, 0.0853553391, 0.05, 0.0146446609},
	}
	for ranks, rates := range want {
		t.Run(fmt.Sprintf("%d process(es)", ranks), func(t *testing.T) {
			got := make([][]float64, ranks)
			runRanks(t, ranks, []accel.Option{accel.WithGradientAccumulationSteps(2)}, func(rank int, acc *accel.Accelerator) error {
				src, err := linSource(16, 0, 0)
				if err != nil {
					return err
				}
				p, err := acc.Prepare(accel.Spec{Model: linearModel(0, false), Loss: losses.MeanSquaredError,
					Optimizer:     optimizers.StochasticGradientDescent().WithDecay(false).Done(),
					SizedSchedule: schedule.Cosine(0.1, 2), Epochs: 3,
					Loaders: []accel.LoaderSpec{{Source: src, Options: []prepare.LoaderOption{prepare.BatchSize(2)}}}})
				if err != nil {
					return err
				}
				perEpoch, err := acc.OptimizerStepsPerEpoch(p.Loaders[0])
				if err != nil {
					return err
				}
				if perEpoch != int64(len(rates)/3) {
					return fmt.Errorf("%d optimizer steps per epoch, want %d", perEpoch, len(rates)/3)
				}
				for epoch := range 3 {
					p.Loaders[0].SetEpoch(epoch)
					for batch, err := range p.Loaders[0].All() {
						if err != nil {
							return err
						}
						err = acc.Accumulate(func() error {
							if _, err := acc.Backward(p.Model, batch); err != nil {
								return err
							}
							next := p.Scheduler.LearningRate()
							stepped, err := p.Optimizer.Step()
							if stepped {
								got[rank] = append(got[rank], next)
							}
							if err != nil {
								return err
							}
							return p.Optimizer.ZeroGrad()
						})
						if err != nil {
							return err
						}
					}
				}
				return nil
			})
			for rank := range ranks {
				require.Len(t, got[rank], len(rates), "rank %d", rank)
				for step, rate := range rates {
					assert.InDelta(t, rate, got[rank][step], 1e-9, "rank %d, step %d", rank, step)
				}
			}
		})
	}
}
