package accel_test

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// shardingRun is one configuration of the sharding tests: the optimizer, K, and what composes with it.
type shardingRun struct {
	name          string
	optimizer     func() optimizers.Interface
	k             int
	clip          float64
	syncEachBatch bool
	compression   accumulate.Compression
	tinyBuckets   bool // one bucket per parameter: buckets smaller than the world, and several buckets
	noSync        bool // the manual pattern: NoSync for K-1 micro-batches
}

func (r shardingRun) options(s accumulate.Sharding) []accel.Option {
	opts := []accel.Option{accel.WithSharding(s)}
	if r.k > 1 && !r.noSync {
		opts = append(opts, accel.WithGradientAccumulationSteps(r.k))
	}
	if r.syncEachBatch {
		opts = append(opts, accel.WithSyncEachBatch())
	}
	if r.compression != accumulate.NoCompression {
		opts = append(opts, accel.WithGradientCompression(r.compression))
	}
	if r.tinyBuckets {
		opts = append(opts, accel.WithBucketCapMB(1e-6))
	}
	return opts
}

// shardedResult is what a rank leaves: its parameters and the elements of optimizer state it holds.
type shardedResult struct {
	params     map[string][]float32
	stateElems int
	steps      int64
	model      *prepare.Model
	opt        *prepare.Optimizer
	loader     *prepare.DataLoader
}

// trainSharded trains the test MLP for steps optimizer steps on this rank's shard of the data.
func (r shardingRun) train(acc *accel.Accelerator, inputs, labels *tensors.Tensor, steps int) (shardedResult, error) {
	ctx := context.New()
	model, err := acc.PrepareModel(ctx, testmodel.MLP, testmodel.Loss)
	if err != nil {
		return shardedResult{}, err
	}
	var optOpts []accel.OptimizerOption
	if r.clip > 0 {
		optOpts = append(optOpts, accel.ClipGradNorm(r.clip))
	}
	opt, err := acc.PrepareOptimizer(model, r.optimizer(), optOpts...)
	if err != nil {
		return shardedResult{}, err
	}
	src, err := accel.TensorSource([]*tensors.Tensor{inputs}, []*tensors.Tensor{labels})
	if err != nil {
		return shardedResult{}, err
	}
	loader, err := acc.PrepareDataLoader(src, accel.BatchSize(2))
	if err != nil {
		return shardedResult{}, err
	}
	i := 0
	for batch, err := range loader.All() {
		if err != nil {
			return shardedResult{}, err
		}
		step := func() error {
			if _, err := opt.Step(); err != nil {
				return err
			}
			return opt.ZeroGrad()
		}
		if r.noSync {
			if (i+1)%r.k != 0 {
				err = acc.NoSync(func() error {
					_, err := acc.Backward(model, batch, accel.LossScale(1/float64(r.k)))
					return err
				})
			} else if _, err = acc.Backward(model, batch, accel.LossScale(1/float64(r.k))); err == nil {
				err = step()
			}
		} else {
			err = acc.Accumulate(func() error {
				if _, err := acc.Backward(model, batch); err != nil {
					return err
				}
				return step()
			})
		}
		if err != nil {
			return shardedResult{}, err
		}
		i++
		if opt.Steps() == int64(steps) {
			break
		}
	}
	res := shardedResult{params: map[string][]float32{}, steps: opt.Steps(), model: model, opt: opt, loader: loader}
	for _, v := range model.Parameters() {
		t, err := v.Value()
		if err != nil {
			return res, err
		}
		if res.params[v.ScopeAndName()], err = tensors.CopyFlatData[float32](t); err != nil {
			return res, err
		}
	}
	for v := range ctx.IterVariables() {
		if strings.HasSuffix(v.Name(), "_moment") {
			res.stateElems += v.Shape().Size()
		}
	}
	return res, nil
}

func runSharded(t *testing.T, n int, r shardingRun, s accumulate.Sharding, steps int) []shardedResult {
	t.Helper()
	k := max(r.k, 1)
	inputs, labels := testmodel.Data(n*k*2*steps, 3)
	results := make([]shardedResult, n)
	runRanks(t, n, r.options(s), func(rank int, acc *accel.Accelerator) error {
		var err error
		results[rank], err = r.train(acc, inputs, labels, steps)
		return err
	})
	return results
}

// TestShardingMatchesReplicated: training with either ZeRO strategy gives the replicated run's weights, on
// 2, 3 and 4 processes, with each optimizer, accumulation, NoSync, sync-each-batch, clipping by global
// norm, bf16 compression, and buckets smaller than the world (the test MLP has 83 parameters, a prime;
// with one bucket per parameter the output bias, 3 elements, is smaller than 4 ranks).
//
// The bound: each rank's update is the replicated update element by element (GoMLX's optimizers are
// element-wise), so the only difference is the order in which the engine sums the ranks' gradients in a
// reduce-scatter and in an all-reduce, and, with clipping, the norm's float64 sum over blocks against
// float32 over the whole. On 2 processes a sum of two values does not depend on the order: the weights
// are the same bit for bit without clipping. Elsewhere they agree to 1e-5 relative after 4 steps.
func TestShardingMatchesReplicated(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 2×40 in-process jobs")
	}
	sgd := func() optimizers.Interface { return testmodel.NewOptimizer(testmodel.SGD) }
	adam := func() optimizers.Interface { return testmodel.NewOptimizer(testmodel.Adam) }
	adamw := func() optimizers.Interface { return optimizers.Adam().LearningRate(0.01).WeightDecay(0.05).Done() }
	rmsprop := func() optimizers.Interface { return optimizers.RMSProp().LearningRate(0.01).Done() }
	runs := []shardingRun{
		{name: "adam", optimizer: adam, k: 1},
		{name: "sgd K=3", optimizer: sgd, k: 3},
		{name: "adamw K=2 tiny buckets", optimizer: adamw, k: 2, tinyBuckets: true},
		{name: "rmsprop", optimizer: rmsprop, k: 1, tinyBuckets: true},
		{name: "adam clip", optimizer: adam, k: 1, clip: 0.05},
		{name: "adam NoSync K=2", optimizer: adam, k: 2, noSync: true},
		{name: "adam sync each batch K=2", optimizer: adam, k: 2, syncEachBatch: true},
		{name: "adam bf16", optimizer: adam, k: 1, compression: accumulate.BF16},
	}
	const steps = 4
	for _, n := range []int{2, 3, 4} {
		for _, r := range runs {
			t.Run(fmt.Sprintf("%d processes/%s", n, r.name), func(t *testing.T) {
				replicated := runSharded(t, n, r, accel.Replicated, steps)
				require.EqualValues(t, steps, replicated[0].steps)
				for _, s := range []accumulate.Sharding{accel.ShardOptimizer, accel.ShardGradients} {
					sharded := runSharded(t, n, r, s, steps)
					for rank := range n {
						require.EqualValues(t, steps, sharded[rank].steps)
						// Every rank holds the same weights: the all-gather gave each the others' blocks.
						assert.Equal(t, sharded[0].params, sharded[rank].params, "%s: rank %d differs from rank 0", s.Name(), rank)
					}
					worst := 0.0
					for name, want := range replicated[0].params {
						got := sharded[0].params[name]
						require.Len(t, got, len(want), name)
						for i := range want {
							worst = max(worst, math.Abs(float64(got[i]-want[i]))/max(math.Abs(float64(want[i])), 1e-3))
						}
					}
					t.Logf("%s: worst %g state %d vs %d", s.Name(), worst, sharded[0].stateElems, replicated[0].stateElems)
					if n == 2 && r.clip == 0 {
						assert.Zero(t, worst, "%s: on 2 processes the weights are the replicated ones bit for bit", s.Name())
					}
					assert.LessOrEqual(t, worst, 1e-5, "%s", s.Name())
					// Each rank holds 1/N of the optimizer's state, up to a bucket's rounding to whole blocks.
					if replicated[0].stateElems > 0 {
						buckets := 1
						if r.tinyBuckets {
							buckets = 4
						}
						perMoment := replicated[0].stateElems / momentsOf(r)
						for rank := range n {
							got := sharded[rank].stateElems / momentsOf(r)
							assert.GreaterOrEqual(t, got, perMoment/n, "%s rank %d", s.Name(), rank)
							assert.LessOrEqual(t, got, perMoment/n+buckets, "%s rank %d", s.Name(), rank)
						}
					}
				}
			})
		}
	}
}

// momentsOf is how many state tensors the run's optimizer keeps per parameter.
func momentsOf(r shardingRun) int {
	if strings.HasPrefix(r.name, "rmsprop") {
		return 1
	}
	return 2
}

// runShardedShape runs fn on the ranks of s with s's K and sharding strategy, an Adam optimizer, and returns
// rank 0's final weights.
func runShardedShape(t *testing.T, s shape, sharding accumulate.Sharding, fn func(acc *accel.Accelerator, r resumable) error) *context.Context {
	t.Helper()
	var final *context.Context
	opts := []accel.Option{accel.WithGradientAccumulationSteps(s.k), accel.WithSeed(11), accel.WithSharding(sharding)}
	runRanks(t, s.ranks, opts, func(rank int, acc *accel.Accelerator) error {
		r := prepareResumableWith(t, acc, testmodel.Adam, resizeExamples, s.b, 1)
		if err := fn(acc, r); err != nil || rank != 0 {
			return err
		}
		snap, err := testmodel.TakeSnapshot(r.model.Parameters())
		final = snap.Context()
		return err
	})
	return final
}

// TestShardedCheckpointsReshard: a checkpoint saved under a sharding strategy by N processes, each writing
// its own blocks of the optimizer state, resumes on another number of processes and under another
// strategy (or replicated), and a replicated checkpoint resumes sharded: the rest of the run gives the
// weights of a run that never stopped, within 1e-5 relative (Adam, whose moments must survive the
// resharding for that). The checkpoint records the strategy and holds one file of blocks per process.
func TestShardedCheckpointsReshard(t *testing.T) {
	if testing.Short() {
		t.Skip("trains in-process jobs of up to 4 ranks")
	}
	const epochs, stopAfter = 2, 4
	type run struct {
		shape    shape
		sharding accumulate.Sharding
	}
	for _, tc := range []struct{ from, to run }{
		{run{shape{4, 1, 2}, accel.ShardOptimizer}, run{shape{2, 1, 4}, accel.ShardGradients}},
		{run{shape{4, 1, 2}, accel.ShardGradients}, run{shape{1, 1, 8}, accel.Replicated}},
		{run{shape{2, 2, 2}, accel.ShardGradients}, run{shape{4, 1, 2}, accel.ShardOptimizer}},
		{run{shape{1, 1, 8}, accel.Replicated}, run{shape{4, 1, 2}, accel.ShardOptimizer}},
		{run{shape{2, 1, 4}, accel.Replicated}, run{shape{2, 2, 2}, accel.ShardGradients}},
	} {
		name := fmt.Sprintf("%d %s to %d %s", tc.from.shape.ranks, tc.from.sharding.Name(), tc.to.shape.ranks,
			tc.to.sharding.Name())
		t.Run(name, func(t *testing.T) {
			require.Equal(t, tc.from.shape.global(), tc.to.shape.global())
			dir := t.TempDir()
			straight := runShardedShape(t, tc.from.shape, tc.from.sharding, func(acc *accel.Accelerator, r resumable) error {
				_, err := r.trainCurve(acc, epochs, 0)
				return err
			})
			var saved string
			atSave := runShardedShape(t, tc.from.shape, tc.from.sharding, func(acc *accel.Accelerator, r resumable) error {
				if _, err := r.trainCurve(acc, epochs, stopAfter); err != nil {
					return err
				}
				path, err := acc.SaveState(dir)
				if acc.IsMainProcess() { // every rank returns the same path
					saved = path
				}
				return err
			})
			state, err := os.ReadFile(filepath.Join(saved, "state.json"))
			require.NoError(t, err)
			blocks, err := filepath.Glob(filepath.Join(saved, "model-0", "blocks", "rank-*.bin"))
			require.NoError(t, err)
			if tc.from.sharding.Stage() > 0 {
				assert.Contains(t, string(state), fmt.Sprintf(`"strategy": %q`, tc.from.sharding.Name()))
				assert.Len(t, blocks, tc.from.shape.ranks, "one file of blocks per process")
			} else {
				assert.NotContains(t, string(state), `"sharding"`)
				assert.Empty(t, blocks)
			}
			resumed := runShardedShape(t, tc.to.shape, tc.to.sharding, func(acc *accel.Accelerator, r resumable) error {
				if err := acc.LoadState(dir); err != nil {
					return err
				}
				_, err := r.trainCurve(acc, epochs, 0)
				return err
			})
			moved, _, err := testmodel.MaxRelativeError(allVariables(resumed), atSave)
			require.NoError(t, err)
			require.Greater(t, moved, 1e-3, "the weights moved after the checkpoint")
			worst, name, err := testmodel.MaxRelativeError(allVariables(resumed), straight)
			require.NoError(t, err)
			assert.LessOrEqual(t, worst, 1e-5, "variable %s", name)
		})
	}
}

// TestShardedSaveFailsTogether: when one process cannot write its blocks of a sharded save, every process
// returns the same error (none hangs), no checkpoint appears, the newest complete one stays the one to
// load, and the next save succeeds.
func TestShardedSaveFailsTogether(t *testing.T) {
	dir := t.TempDir()
	defer accel.SetBlocksWritten(nil)
	errs := make([]error, 4)
	runRanks(t, 4, []accel.Option{accel.WithSharding(accel.ShardGradients), accel.WithSeed(3)}, func(rank int, acc *accel.Accelerator) error {
		r := prepareResumableWith(t, acc, testmodel.Adam, 32, 2, 1)
		if _, err := r.trainCurve(acc, 1, 1); err != nil {
			return err
		}
		if _, err := acc.SaveState(dir); err != nil {
			return err
		}
		if rank == 0 {
			accel.SetBlocksWritten(func(rank int) error {
				if rank == 2 {
					return fmt.Errorf("disk full on rank %d", rank)
				}
				return nil
			})
		}
		// Every rank reaches the barrier below only after rank 0 installed the hook.
		if err := acc.WaitForEveryone(); err != nil {
			return err
		}
		_, errs[rank] = acc.SaveState(dir)
		if err := acc.WaitForEveryone(); err != nil {
			return err
		}
		if rank == 0 {
			accel.SetBlocksWritten(nil)
		}
		if err := acc.WaitForEveryone(); err != nil {
			return err
		}
		_, err := acc.SaveState(dir)
		return err
	})
	for rank, err := range errs {
		require.Error(t, err, "rank %d", rank)
		assert.Contains(t, err.Error(), "disk full on rank 2", "rank %d", rank)
	}
	all, err := filepath.Glob(filepath.Join(dir, "checkpoint-*"))
	require.NoError(t, err)
	assert.Len(t, all, 2, "the failed save left no checkpoint: %v", all)
	temps, err := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	require.NoError(t, err)
	assert.Empty(t, temps)
}

// customSGD is an optimizer goaccel does not know: GoMLX's SGD under another type.
type customSGD struct{ *optimizers.SGDConfig }

// TestShardingRefusesUnknownOptimizers: a sharding strategy updates parameter blocks, which is the
// replicated update only for an element-wise optimizer: one goaccel does not know is refused with an error
// that says what to do, and accepted once the program vouches for it.
func TestShardingRefusesUnknownOptimizers(t *testing.T) {
	runRanks(t, 2, []accel.Option{accel.WithSharding(accel.ShardOptimizer)}, func(rank int, acc *accel.Accelerator) error {
		model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
		if err != nil {
			return err
		}
		custom := customSGD{optimizers.StochasticGradientDescent()}
		_, err = acc.PrepareOptimizer(model, custom)
		if assert.Error(t, err) {
			assert.Contains(t, err.Error(), `sharding "optimizer"`)
			assert.Contains(t, err.Error(), "accel_test.customSGD")
			assert.Contains(t, err.Error(), "prepare.ElementWise()")
		}
		_, err = acc.PrepareOptimizer(model, custom, accel.ElementWise())
		return err
	})
	// Replicated training takes any optimizer.
	runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
		model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
		if err != nil {
			return err
		}
		_, err = acc.PrepareOptimizer(model, customSGD{optimizers.StochasticGradientDescent()})
		return err
	})
}

// Under ShardOptimizer each of 2 processes keeps Adam's moments for half of the parameters (the test
// MLP's 83, one bucket: blocks of 42), and the weights stay the same on every process. The processes here
// are goroutines of one in-process group; under `accel launch -n 2` the program is the same without
// WithCommunicator.
func ExampleWithSharding() {
	comms, err := backends.NewInProcessGroup(2)
	if err != nil {
		fmt.Println(err)
		return
	}
	stats := make([]accel.Stats, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Go(func() {
			acc, err := accel.New(accel.WithCommunicator(comms[rank]), accel.WithSharding(accel.ShardOptimizer))
			if err != nil {
				panic(err)
			}
			defer acc.Close()
			model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			if err != nil {
				panic(err)
			}
			opt, err := acc.PrepareOptimizer(model, optimizers.Adam().Done())
			if err != nil {
				panic(err)
			}
			x, y := testmodel.Data(16, 1)
			src, err := accel.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
			if err != nil {
				panic(err)
			}
			loader, err := acc.PrepareDataLoader(src, accel.BatchSize(4))
			if err != nil {
				panic(err)
			}
			for batch, err := range loader.All() {
				if err != nil {
					panic(err)
				}
				if _, err := acc.Backward(model, batch); err != nil {
					panic(err)
				}
				if _, err := opt.Step(); err != nil {
					panic(err)
				}
				if err := opt.ZeroGrad(); err != nil {
					panic(err)
				}
			}
			stats[rank] = acc.Stats()
		})
	}
	wg.Wait()
	for rank, s := range stats {
		fmt.Printf("rank %d: %s, %d steps, %d bytes of optimizer state\n", rank, s.Sharding, s.OptimizerSteps,
			s.OptimizerStateBytes)
	}
	// Output:
	// rank 0: optimizer, 2 steps, 336 bytes of optimizer state
	// rank 1: optimizer, 2 steps, 336 bytes of optimizer state
}
