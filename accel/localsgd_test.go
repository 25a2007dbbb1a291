package accel_test

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// localRun trains the test MLP on every rank for epochs over n examples (batch b, shuffled) with opts,
// calling after (if set) after every micro-batch whose optimizer step was applied, and returns each rank's
// flattened parameters and its accelerator's stats.
func localRun(t *testing.T, ranks int, kind testmodel.OptimizerKind, n, b, epochs int, opts []accel.Option,
	after func(rank int, acc *accel.Accelerator, r resumable) error) ([][]float64, []accel.Stats) {
	t.Helper()
	params := make([][]float64, ranks)
	stats := make([]accel.Stats, ranks)
	runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
		r := prepareResumableWith(t, acc, kind, n, b, 1)
		err := r.loop(acc, epochs, func(_ float64, stepped bool) (bool, error) {
			if stepped && after != nil {
				return false, after(rank, acc, r)
			}
			return false, nil
		})
		if err != nil {
			return err
		}
		for _, v := range r.model.Parameters() {
			flat, err := testmodel.FlatFloat64(v)
			if err != nil {
				return err
			}
			params[rank] = append(params[rank], flat...)
		}
		stats[rank] = acc.Stats()
		return nil
	})
	return params, stats
}

// maxAbsDiff is the largest element-wise difference of two equally long vectors.
func maxAbsDiff(t *testing.T, a, b []float64) float64 {
	t.Helper()
	require.Len(t, b, len(a))
	worst := 0.0
	for i := range a {
		worst = max(worst, math.Abs(a[i]-b[i]))
	}
	return worst
}

// TestLocalSGDWithOneStepIsSynchronous: averaging the parameters after one plain-SGD step from the same
// start is averaging the gradients, θ − lr·mean(g) = mean(θ − lr·g_r): H=1 local SGD gives synchronous
// training's weights up to float rounding (float32 parameters), on 2 and 4 ranks, with K=1 and K=2 (H
// counts optimizer steps) — and sends no gradient.
func TestLocalSGDWithOneStepIsSynchronous(t *testing.T) {
	for _, ranks := range []int{2, 4} {
		for _, k := range []int{1, 2} {
			t.Run(fmt.Sprintf("ranks=%d/K=%d", ranks, k), func(t *testing.T) {
				const b, epochs = 2, 2
				n := ranks * b * k * 6
				base := []accel.Option{accel.WithGradientAccumulationSteps(k)}
				sync, _ := localRun(t, ranks, testmodel.SGD, n, b, epochs, base, nil)
				local, stats := localRun(t, ranks, testmodel.SGD, n, b, epochs, append(base, accel.WithLocalSGD(1)), nil)
				for r := range ranks {
					assert.Equal(t, local[0], local[r], "rank %d: replicas are identical after every average", r)
					assert.Zero(t, stats[r].Syncs, "rank %d: no gradient all-reduce", r)
					assert.EqualValues(t, 12, stats[r].OptimizerSteps)
					assert.EqualValues(t, 12, stats[r].ParameterAverages)
					assert.Equal(t, "local SGD (H=1)", stats[r].Mode)
				}
				assert.Less(t, maxAbsDiff(t, sync[0], local[0]), 1e-5)
				assert.NotEqual(t, sync[0], local[0], "rounding differs: the two paths really ran")
			})
		}
	}
}

// TestLocalSGDReplicasPartBetweenAverages: with H=4 every rank holds the same parameters right after each
// average and different ones in between (each stepped on its own data), on 2 and 4 ranks; the replica
// check runs after each average and passes.
func TestLocalSGDReplicasPartBetweenAverages(t *testing.T) {
	for _, ranks := range []int{2, 4} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			const b, h = 2, 4
			n := ranks * b * 16
			var averaged, parted [4]int
			_, stats := localRun(t, ranks, testmodel.Adam, n, b, 1,
				[]accel.Option{accel.WithLocalSGD(h), accel.WithReplicaCheck()},
				func(rank int, acc *accel.Accelerator, r resumable) error {
					err := replicas.CheckReplicasInSync(acc.Communicator(), r.model.Parameters())
					since := r.opt.LocalStepsSinceAverage()
					if want := int(r.opt.Steps() % h); since != want {
						return fmt.Errorf("after step %d: %d steps since the average, want %d", r.opt.Steps(), since, want)
					}
					switch {
					case since == 0 && err != nil:
						return fmt.Errorf("after the average of step %d: %w", r.opt.Steps(), err)
					case since == 0:
						averaged[rank]++
					case err == nil:
						return fmt.Errorf("after step %d, %d steps into a period, the replicas are identical", r.opt.Steps(), since)
					default:
						parted[rank]++
					}
					return nil
				})
			for r := range ranks {
				assert.Equal(t, 4, averaged[r], "rank %d", r)
				assert.Equal(t, 12, parted[r], "rank %d", r)
				assert.EqualValues(t, 4, stats[r].ParameterAverages)
			}
		})
	}
}

// TestDiLoCoWithUnitOuterStepIsLocalSGD: an outer step of learning rate 1 without momentum sets θ_outer to
// the mean of the processes' parameters, which is local SGD's average (up to the rounding of θ − (θ − mean)).
func TestDiLoCoWithUnitOuterStepIsLocalSGD(t *testing.T) {
	for _, ranks := range []int{2, 4} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			const b, h = 2, 3
			n := ranks * b * 12
			local, _ := localRun(t, ranks, testmodel.Adam, n, b, 2, []accel.Option{accel.WithLocalSGD(h)}, nil)
			diloco, stats := localRun(t, ranks, testmodel.Adam, n, b, 2, []accel.Option{accel.WithDiLoCo(h, 1, 0)}, nil)
			assert.Less(t, maxAbsDiff(t, local[0], diloco[0]), 1e-5)
			for r := range ranks {
				assert.Equal(t, diloco[0], diloco[r], "rank %d", r)
				assert.EqualValues(t, 8, stats[r].ParameterAverages)
				assert.Equal(t, "DiLoCo (H=3, outer lr 1, momentum 0)", stats[r].Mode)
			}
			// With the paper's outer optimizer the weights go elsewhere.
			paper, _ := localRun(t, ranks, testmodel.Adam, n, b, 2,
				[]accel.Option{accel.WithDiLoCo(h, prepare.DefaultOuterLearningRate, prepare.DefaultOuterMomentum)}, nil)
			assert.Greater(t, maxAbsDiff(t, local[0], paper[0]), 1e-3)
		})
	}
}

// dilocoByHand is DiLoCo on the conformance tests' linear model (w from 0, SGD at confLR, no shuffling,
// K=1): rank r's batch s holds examples (s·b + i)·N + r; every h inner steps the mean of the ranks' weights
// gives Δ = θ_outer − mean, v ← μv + Δ, θ_outer ← θ_outer − lr(Δ + μv).
func dilocoByHand(ranks, batches, h int, lr, mu float64) [2]float64 {
	var outer, v [2]float64
	w := make([][2]float64, ranks)
	for r := range w {
		w[r] = outer
	}
	for s := range batches {
		for r := range ranks {
			indices := make([]int, confBatch)
			for i := range indices {
				indices[i] = (s*confBatch+i)*ranks + r
			}
			g := linGradOf(w[r], indices)
			w[r][0] -= confLR * g[0]
			w[r][1] -= confLR * g[1]
		}
		if (s+1)%h != 0 {
			continue
		}
		for j := range 2 {
			mean := 0.0
			for r := range ranks {
				mean += w[r][j]
			}
			delta := outer[j] - mean/float64(ranks)
			v[j] = mu*v[j] + delta
			outer[j] -= lr * (delta + mu*v[j])
		}
		for r := range w {
			w[r] = outer
		}
	}
	return outer
}

// TestDiLoCoMatchesHandComputation: the linear model's two float64 weights after three DiLoCo periods
// (so the outer momentum acts twice) equal the arithmetic of dilocoByHand, on 2 and 4 ranks.
func TestDiLoCoMatchesHandComputation(t *testing.T) {
	const h, batches, lr, mu = 2, 6, 0.7, 0.9
	for _, ranks := range []int{2, 4} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			want := dilocoByHand(ranks, batches, h, lr, mu)
			plain := dilocoByHand(ranks, batches, h, 1, 0)
			require.Greater(t, math.Abs(want[0]-plain[0]), 1e-3, "the outer optimizer matters in this case")
			got := make([][]float64, ranks)
			runRanks(t, ranks, []accel.Option{accel.WithDiLoCo(h, lr, mu)}, func(rank int, acc *accel.Accelerator) error {
				model, err := acc.PrepareModel(context.New(), linearModel(0, false), losses.MeanSquaredError)
				if err != nil {
					return err
				}
				opt, err := acc.PrepareOptimizer(model,
					optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(confLR))
				if err != nil {
					return err
				}
				src, err := linSource(ranks*confBatch*batches, 0, 0)
				if err != nil {
					return err
				}
				loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(confBatch))
				if err != nil {
					return err
				}
				for batch, err := range loader.All() {
					if err != nil {
						return err
					}
					if _, err := acc.Backward(model, batch); err != nil {
						return err
					}
					if _, err := opt.Step(); err != nil {
						return err
					}
					if err := opt.ZeroGrad(); err != nil {
						return err
					}
				}
				got[rank], err = testmodel.FlatFloat64(model.Parameters()[0])
				return err
			})
			for r := range ranks {
				require.Len(t, got[r], 2)
				assert.InDelta(t, want[0], got[r][0], 1e-12, "rank %d", r)
				assert.InDelta(t, want[1], got[r][1], 1e-12, "rank %d", r)
			}
		})
	}
}

// TestLocalSGDCounters: no gradient all-reduce at all, and one all-reduce per parameter bucket every H
// optimizer steps, carrying the parameters' bytes: H times fewer all-reduced bytes per step than
// synchronous training, whose every step all-reduces each bucket once.
func TestLocalSGDCounters(t *testing.T) {
	const ranks, b, h = 2, 2, 4
	n := ranks * b * 16
	// Small buckets, so that the plan has several.
	base := []accel.Option{accel.WithBucketCapMB(0.0002)}
	var buckets, paramBytes int
	count := func(rank int, acc *accel.Accelerator, r resumable) error {
		if rank == 0 && buckets == 0 {
			buckets = len(r.model.Plan().Buckets)
			for _, bucket := range r.model.Plan().Buckets {
				paramBytes += bucket.Bytes()
			}
		}
		return nil
	}
	_, sync := localRun(t, ranks, testmodel.Adam, n, b, 1, base, count)
	_, local := localRun(t, ranks, testmodel.Adam, n, b, 1, append(base, accel.WithLocalSGD(h)), nil)
	require.Greater(t, buckets, 1)
	for r := range ranks {
		steps := sync[r].OptimizerSteps
		require.EqualValues(t, 16, steps)
		require.Equal(t, steps, local[r].OptimizerSteps)
		syncReduce, localReduce := sync[r].Collectives.Of(backends.OpAllReduce), local[r].Collectives.Of(backends.OpAllReduce)
		assert.Equal(t, steps, sync[r].Syncs)
		assert.Zero(t, local[r].Syncs, "no gradient all-reduce")
		assert.EqualValues(t, steps*int64(buckets), syncReduce.Calls)
		assert.EqualValues(t, steps/h*int64(buckets), localReduce.Calls, "one all-reduce per bucket per average")
		assert.EqualValues(t, steps*int64(paramBytes), syncReduce.Bytes)
		assert.EqualValues(t, steps/h*int64(paramBytes), localReduce.Bytes)
		assert.Equal(t, "synchronous", sync[r].Mode)
		assert.EqualValues(t, 4, local[r].ParameterAverages)
	}
}

// TestLocalSGDBuffersAreAveraged: batch normalisation's moving averages part between averages (no buffer
// sync at the steps) and are averaged with the parameters.
func TestLocalSGDBuffersAreAveraged(t *testing.T) {
	const ranks, h = 2, 2
	runRanks(t, ranks, []accel.Option{accel.WithLocalSGD(h)}, func(rank int, acc *accel.Accelerator) error {
		model, err := acc.PrepareModel(context.New(), batchNormMLP, testmodel.Loss)
		if err != nil {
			return err
		}
		opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.SGD))
		if err != nil {
			return err
		}
		x, y := testmodel.Data(ranks*4*4, 3)
		src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
		if err != nil {
			return err
		}
		loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(4))
		if err != nil {
			return err
		}
		for batch, err := range loader.All() {
			if err != nil {
				return err
			}
			if _, err := acc.Backward(model, batch); err != nil {
				return err
			}
			if _, err := opt.Step(); err != nil {
				return err
			}
			if err := opt.ZeroGrad(); err != nil {
				return err
			}
			if len(model.Buffers()) == 0 {
				return errors.New("the model has no buffers")
			}
			err := replicas.CheckReplicasInSync(acc.Communicator(), model.Buffers())
			switch since := opt.LocalStepsSinceAverage(); {
			case since == 0 && err != nil:
				return fmt.Errorf("buffers after an average: %w", err)
			case since != 0 && err == nil:
				return errors.New("buffers identical between averages: they were synced at a step")
			}
		}
		return nil
	})
}

// TestLocalSGDRefusesMisuse: a period under 1, a sharding strategy, gradient compression, sync-each-batch
// and Join are refused with what to do instead.
func TestLocalSGDRefusesMisuse(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []accel.Option
		want string
	}{
		{"zero period", []accel.Option{accel.WithLocalSGD(0)}, "at least 1 optimizer step between averages, got 0"},
		{"negative period", []accel.Option{accel.WithDiLoCo(-2, 0.7, 0.9)}, "DiLoCo needs at least 1"},
		{"outer lr", []accel.Option{accel.WithDiLoCo(4, 0, 0.9)}, "outer learning rate must be a positive number"},
		{"outer momentum", []accel.Option{accel.WithDiLoCo(4, 0.7, 1)}, "outer momentum must be in [0, 1)"},
		{"sharding", []accel.Option{accel.WithLocalSGD(4), accel.WithSharding(accel.ShardOptimizer)}, "use accel.Replicated"},
		{"compression", []accel.Option{accel.WithLocalSGD(4), accel.WithGradientCompression(accumulate.BF16)},
			"leave compression off"},
		{"sync each batch", []accel.Option{accel.WithDiLoCo(4, 0.7, 0.9), accel.WithSyncEachBatch()}, "use one or the other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := accel.New(append([]accel.Option{accel.WithBackend("go")}, tc.opts...)...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	t.Run("environment", func(t *testing.T) {
		t.Setenv(accel.LocalSGDEnvVar, "8")
		cfg, err := accel.Resolve()
		require.NoError(t, err)
		require.NotNil(t, cfg.LocalSGD)
		assert.Equal(t, "local SGD (H=8)", cfg.LocalSGD.String())
		t.Setenv(accel.LocalSGDEnvVar, "")
		t.Setenv(accel.DiLoCoEnvVar, "4")
		cfg, err = accel.Resolve()
		require.NoError(t, err)
		assert.Equal(t, "DiLoCo (H=4, outer lr 0.7, momentum 0.9)", cfg.LocalSGD.String())
		t.Setenv(accel.DiLoCoEnvVar, "8:1:0.5")
		cfg, err = accel.Resolve()
		require.NoError(t, err)
		assert.Equal(t, "DiLoCo (H=8, outer lr 1, momentum 0.5)", cfg.LocalSGD.String())
		for _, bad := range []string{"-1", "8:x", "8:1:0.5:2"} {
			t.Setenv(accel.DiLoCoEnvVar, bad)
			_, err = accel.Resolve()
			require.ErrorContains(t, err, "GOACCEL_DILOCO", bad)
		}
	})
	t.Run("join", func(t *testing.T) {
		acc := newSingle(t, accel.WithLocalSGD(2))
		r := prepareResumable(t, acc, 8, 2, 1)
		err := acc.Join(r.model, r.opt, func() error { return nil })
		require.ErrorContains(t, err, "steps on each process's own gradients")
	})
}

// TestLocalSGDResumeIsBitwiseExact: a run saved between two averages (and inside an accumulation cycle)
// and resumed on the same number of processes ends with every rank's parameters and optimizer state
// bitwise those of a run that never stopped, for local SGD and DiLoCo with Adam (whose moments are each
// process's own). The same checkpoint is refused on another number of processes, and one saved right
// after an average resumes there.
func TestLocalSGDResumeIsBitwiseExact(t *testing.T) {
	const ranks, k, b, epochs, h = 2, 2, 2, 2, 3
	n := ranks * b * 12 // 12 micro-batches, 6 optimizer steps per epoch
	for _, mode := range []accel.Option{accel.WithLocalSGD(h), accel.WithDiLoCo(h, 0.7, 0.9)} {
		opts := []accel.Option{accel.WithGradientAccumulationSteps(k), accel.WithSeed(7), mode}
		cfg, err := accel.Resolve(opts...)
		require.NoError(t, err)
		name := cfg.LocalSGD.String()
		t.Run(name, func(t *testing.T) {
			stopAfter := 12 + 5 // epoch 1: 8 steps in (2 into the third period), one micro-batch into a cycle
			straight := make([][32]byte, ranks)
			resumed := make([][32]byte, ranks)
			digest := func(r resumable) ([32]byte, error) { return replicas.VariablesDigest(r.model.ReplicatedVariables()) }
			runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
				r := prepareResumable(t, acc, n, b, 1)
				if _, err := r.train(acc, epochs, 0); err != nil {
					return err
				}
				var err error
				straight[rank], err = digest(r)
				return err
			})
			// Checkpoints right after an average (6 steps), between averages at a step boundary (8 steps), and
			// between averages inside an accumulation cycle (one micro-batch later).
			dir, boundary, between := t.TempDir(), t.TempDir(), t.TempDir()
			saves := map[int]string{12: boundary, stopAfter - 1: between, stopAfter: dir}
			wantSince := map[int]int{12: 0, stopAfter - 1: 2, stopAfter: 2}
			runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
				r := prepareResumable(t, acc, n, b, 1)
				ran := 0
				return r.loop(acc, epochs, func(float64, bool) (bool, error) {
					ran++
					target, ok := saves[ran]
					if !ok {
						return false, nil
					}
					if since := r.opt.LocalStepsSinceAverage(); since != wantSince[ran] {
						return true, fmt.Errorf("after %d micro-batches, %d steps since the average, want %d", ran, since,
							wantSince[ran])
					}
					_, err := acc.SaveState(target)
					return ran == stopAfter, err
				})
			})
			runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
				r := prepareResumable(t, acc, n, b, 1)
				if err := acc.LoadState(dir); err != nil {
					return err
				}
				if r.opt.LocalStepsSinceAverage() != 2 || r.opt.Steps() != 8 {
					return fmt.Errorf("restored %d steps, %d since the average", r.opt.Steps(), r.opt.LocalStepsSinceAverage())
				}
				if _, err := r.train(acc, epochs, 0); err != nil {
					return err
				}
				var err error
				resumed[rank], err = digest(r)
				return err
			})
			assert.Equal(t, straight, resumed, "every rank bitwise as the run that never stopped")
			assert.NotEqual(t, straight[0], straight[1], "the optimizer states are each rank's own")

			// Another number of processes: refused between averages, taken right after one.
			acc := newSingle(t, opts...)
			r := prepareResumable(t, acc, n, b, 1)
			err := acc.LoadState(between)
			require.ErrorIs(t, err, prepare.ErrInsidePeriod)
			assert.Contains(t, err.Error(), "2 optimizer steps after the last average, on 2 processes")
			acc = newSingle(t, opts...)
			r = prepareResumable(t, acc, n, b, 1)
			require.NoError(t, acc.LoadState(boundary))
			assert.EqualValues(t, 6, r.opt.Steps())
			assert.Zero(t, r.opt.LocalStepsSinceAverage())
			_, err = r.train(acc, epochs, 0)
			require.NoError(t, err)
		})
	}
}
