package accel_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// shardingMPIRuns are the configurations TestShardingMPI trains under each strategy with real MPI.
var shardingMPIRuns = []shardingRun{
	{name: "adam", optimizer: func() optimizers.Interface { return testmodel.NewOptimizer(testmodel.Adam) }, k: 1},
	{name: "adamw K=2 tiny buckets", k: 2, tinyBuckets: true,
		optimizer: func() optimizers.Interface { return optimizers.Adam().LearningRate(0.01).WeightDecay(0.05).Done() }},
	{name: "adam clip", optimizer: func() optimizers.Interface { return testmodel.NewOptimizer(testmodel.Adam) },
		k: 1, clip: 0.05},
	{name: "adam bf16", optimizer: func() optimizers.Interface { return testmodel.NewOptimizer(testmodel.Adam) },
		k: 1, compression: accumulate.BF16},
}

// shardingMPIReport is one rank's parameters after each configuration, by strategy, and the collectives
// the last sharded configuration called.
type shardingMPIReport struct {
	Params map[string][]map[string][]float32 `json:"params"`
	// ReduceScatters, AllGathers and AllReduces are the calls of one more optimizer step under
	// ShardOptimizer with one bucket per parameter.
	ReduceScatters, AllGathers, AllReduces int64
}

// TestShardingMPI: under mpirun with 2 and 4 ranks (the MPI engine's reduce-scatter and all-gather), either
// ZeRO strategy trains to the replicated run's weights within 1e-5 relative (1e-2 with bf16 on the wire,
// whose partial sums the reduce-scatter rounds in another order than the all-reduce does), every rank holds
// the same weights, and a step reduce-scatters each bucket once, all-gathers each once, and all-reduces
// nothing.
func TestShardingMPI(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(shardingMPIRank))
		return
	}
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			results := mpitest.Run(t, np, "TestShardingMPI", mpitest.WithTimeout(4*time.Minute))
			reports := make([]shardingMPIReport, np)
			for r, res := range results {
				require.NoError(t, res.Decode(&reports[r]))
			}
			for i, run := range shardingMPIRuns {
				replicated := reports[0].Params["replicated"][i]
				for _, s := range []string{"optimizer", "gradients"} {
					for rank := range np {
						assert.Equal(t, reports[0].Params[s][i], reports[rank].Params[s][i], "%s %s: rank %d", run.name, s, rank)
					}
					worst := 0.0
					for name, want := range replicated {
						got := reports[0].Params[s][i][name]
						require.Len(t, got, len(want))
						for j := range want {
							worst = max(worst, math.Abs(float64(got[j]-want[j]))/max(math.Abs(float64(want[j])), 1e-3))
						}
					}
					bound := 1e-5
					if run.compression != accumulate.NoCompression {
						bound = 1e-2
					}
					assert.LessOrEqual(t, worst, bound, "%s %s", run.name, s)
				}
			}
			rep := reports[0]
			const buckets = 4 // the test MLP's four parameters, one bucket each
			assert.EqualValues(t, buckets, rep.ReduceScatters, "one reduce-scatter per bucket per step")
			assert.EqualValues(t, buckets, rep.AllGathers, "one all-gather per bucket per step")
			assert.Zero(t, rep.AllReduces, "no all-reduce")
		})
	}
}

func shardingMPIRank(keeper *backends.Communicator) (any, error) {
	rep := shardingMPIReport{Params: map[string][]map[string][]float32{}}
	size := keeper.Size()
	const steps = 4
	for _, run := range shardingMPIRuns {
		inputs, labels := testmodel.Data(size*max(run.k, 1)*2*steps, 3)
		for _, s := range []accumulate.Sharding{accel.Replicated, accel.ShardOptimizer, accel.ShardGradients} {
			acc, err := accel.New(append([]accel.Option{accel.WithBackend("go")}, run.options(s)...)...)
			if err != nil {
				return nil, err
			}
			res, err := run.train(acc, inputs, labels, steps)
			if err != nil {
				return nil, err
			}
			rep.Params[s.Name()] = append(rep.Params[s.Name()], res.params)
			if run.tinyBuckets && s == accel.ShardOptimizer {
				if err := oneMoreStep(acc, res, &rep); err != nil {
					return nil, err
				}
			}
			if err := acc.Close(); err != nil {
				return nil, err
			}
		}
	}
	return rep, nil
}

// shardedKillDirEnv names the checkpoint directory of TestShardedSaveKilledMPI's job.
const shardedKillDirEnv = "GOACCEL_TEST_SHARDED_KILL_DIR"

// TestShardedSaveKilledMPI: a process killed with SIGKILL in the middle of a sharded save (its blocks
// written, the others' perhaps not, nothing renamed) ends the job without a hang, and the newest complete
// checkpoint, the one before, loads — here into one replicated process, which reassembles the optimizer
// state from the blocks of 2 — with the weights it was saved with.
func TestShardedSaveKilledMPI(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(func(keeper *backends.Communicator) (any, error) { return shardedKillRank(t, keeper) }))
		return
	}
	dir := t.TempDir()
	out := mpitest.Launch(t, 2, t.Name(), mpitest.WithEnv(shardedKillDirEnv+"="+dir), mpitest.WithTimeout(2*time.Minute))
	require.NotZero(t, out.ExitCode, "the job ends when a rank is killed\n%s", out)
	require.False(t, out.TimedOut, "nothing hangs\n%s", out)
	complete, err := filepath.Glob(filepath.Join(dir, "checkpoint-*"))
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(dir, "checkpoint-00000001")}, complete, "the killed save was never renamed into place")

	var want map[string][]float32
	data, err := os.ReadFile(filepath.Join(dir, "weights-at-save.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &want))

	runRanks(t, 1, []accel.Option{accel.WithSeed(5)}, func(rank int, acc *accel.Accelerator) error {
		r := prepareResumableWith(t, acc, testmodel.Adam, 32, 4, 1)
		if err := acc.LoadState(dir); err != nil {
			return err
		}
		for _, v := range r.model.Parameters() {
			value, err := v.Value()
			if err != nil {
				return err
			}
			got, err := tensors.CopyFlatData[float32](value)
			if err != nil {
				return err
			}
			assert.Equal(t, want[v.ScopeAndName()], got, v.ScopeAndName())
		}
		stats := acc.Stats()
		assert.Positive(t, stats.OptimizerStateBytes, "the replicated process holds the whole optimizer state")
		return nil
	})
}

func shardedKillRank(t *testing.T, _ *backends.Communicator) (any, error) {
	dir := os.Getenv(shardedKillDirEnv)
	acc, err := accel.New(accel.WithBackend("go"), accel.WithSharding(accel.ShardGradients), accel.WithSeed(5))
	if err != nil {
		return nil, err
	}
	r := prepareResumableWith(t, acc, testmodel.Adam, 32, 2, 1)
	if _, err := r.trainCurve(acc, 1, 2); err != nil {
		return nil, err
	}
	if _, err := acc.SaveState(dir); err != nil {
		return nil, err
	}
	if acc.IsMainProcess() {
		weights := map[string][]float32{}
		for _, v := range r.model.Parameters() {
			value, err := v.Value()
			if err != nil {
				return nil, err
			}
			if weights[v.ScopeAndName()], err = tensors.CopyFlatData[float32](value); err != nil {
				return nil, err
			}
		}
		data, err := json.Marshal(weights)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "weights-at-save.json"), data, 0o644); err != nil {
			return nil, err
		}
	}
	if _, err := r.trainCurve(acc, 1, 1); err != nil {
		return nil, err
	}
	accel.SetBlocksWritten(func(rank int) error {
		if rank == 1 {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			time.Sleep(time.Minute)
		}
		return nil
	})
	_, err = acc.SaveState(dir)
	return nil, fmt.Errorf("the save went on after rank 1 was killed: %v", err)
}

// oneMoreStep takes one more optimizer step of K micro-batches and counts its collectives.
func oneMoreStep(acc *accel.Accelerator, res shardedResult, rep *shardingMPIReport) error {
	before := acc.Stats().Collectives
	batch, err := res.loader.PeekBatch()
	if err != nil {
		return err
	}
	for range acc.GradientAccumulationSteps() {
		err := acc.Accumulate(func() error {
			if _, err := acc.Backward(res.model, batch); err != nil {
				return err
			}
			if _, err := res.opt.Step(); err != nil {
				return err
			}
			return res.opt.ZeroGrad()
		})
		if err != nil {
			return err
		}
	}
	c := acc.Stats().Collectives.Sub(before)
	rep.ReduceScatters, rep.AllGathers = c.Of(backends.OpReduceScatter).Calls, c.Of(backends.OpAllGather).Calls
	rep.AllReduces = c.Of(backends.OpAllReduce).Calls
	return nil
}
