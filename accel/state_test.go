package accel_test

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// resumable is one rank's prepared training objects.
type resumable struct {
	model  *prepare.Model
	opt    *prepare.Optimizer
	loader *prepare.DataLoader
}

func prepareResumable(t testing.TB, acc *accel.Accelerator, n, b int, seed uint64) resumable {
	t.Helper()
	return prepareResumableWith(t, acc, testmodel.Adam, n, b, seed)
}

func prepareResumableWith(t testing.TB, acc *accel.Accelerator, kind testmodel.OptimizerKind, n, b int, seed uint64) resumable {
	t.Helper()
	model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
	require.NoError(t, err)
	opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(kind))
	require.NoError(t, err)
	x, y := testmodel.Data(n, seed)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	require.NoError(t, err)
	loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(b), prepare.Shuffle())
	require.NoError(t, err)
	return resumable{model, opt, loader}
}

// loop runs the user's loop from the loader's current epoch to epochs, calling after with each
// micro-batch's loss and whether the optimizer stepped on it, until after says to stop.
func (r resumable) loop(acc *accel.Accelerator, epochs int, after func(loss float64, stepped bool) (stop bool, err error)) error {
	for epoch := r.loader.Epoch(); epoch < epochs; epoch++ {
		r.loader.SetEpoch(epoch)
		for batch, err := range r.loader.All() {
			if err != nil {
				return err
			}
			var loss float64
			var stepped bool
			err = acc.Accumulate(func() error {
				if loss, err = acc.Backward(r.model, batch); err != nil {
					return err
				}
				if stepped, err = r.opt.Step(); err != nil {
					return err
				}
				return r.opt.ZeroGrad()
			})
			if err != nil {
				return err
			}
			if stop, err := after(loss, stepped); stop || err != nil {
				return err
			}
		}
	}
	return nil
}

// train runs the loop from the loader's current epoch to epochs, stopping after stopAfter micro-batches
// (if > 0). It returns the number of micro-batches run.
func (r resumable) train(acc *accel.Accelerator, epochs, stopAfter int) (int, error) {
	ran := 0
	err := r.loop(acc, epochs, func(float64, bool) (bool, error) {
		ran++
		return stopAfter > 0 && ran == stopAfter, nil
	})
	return ran, err
}

// loadChangesNothingOnRefusal builds r's model, loads dir, and checks that on this rank a refusal left the
// weights, the optimizer's steps and the data place as they were. It returns LoadState's error.
func loadChangesNothingOnRefusal(t testing.TB, acc *accel.Accelerator, r resumable, dir string) error {
	t.Helper()
	require.NoError(t, r.model.Materialize(must(r.loader.PeekBatch())))
	before, err := replicas.VariablesDigest(r.model.ReplicatedVariables())
	require.NoError(t, err)
	loadErr := acc.LoadState(dir)
	if loadErr == nil {
		return nil
	}
	after, err := replicas.VariablesDigest(r.model.ReplicatedVariables())
	require.NoError(t, err)
	assert.Equal(t, before, after, "a refused checkpoint changes no weight")
	assert.Zero(t, r.opt.Steps())
	assert.Equal(t, prepare.LoaderState{}, r.loader.State())
	return loadErr
}

// TestResumeIsBitwiseExact: training E epochs straight through and training, checkpointing mid-epoch and
// mid-accumulation-cycle, then resuming in a fresh accelerator, end with bitwise-identical weights: replicated,
// under either sharding strategy (Adam's moments in the processes' blocks, and under ShardGradients the
// accumulators made for the cycle), and with PowerSGD (its error feedback and Qs).
func TestResumeIsBitwiseExact(t *testing.T) {
	const k, b, epochs = 3, 2, 2
	for _, tc := range []struct {
		ranks    int
		sharding accumulate.Sharding
		powerSGD bool
	}{{1, accel.Replicated, false}, {2, accel.Replicated, false}, {2, accel.ShardOptimizer, false},
		{2, accel.ShardGradients, false}, {2, accel.Replicated, true}} {
		ranks := tc.ranks
		name := fmt.Sprintf("ranks=%d/%s", ranks, tc.sharding.Name())
		if tc.powerSGD {
			name += "/powersgd"
		}
		t.Run(name, func(t *testing.T) {
			n := ranks * b * 11 // 11 micro-batches per epoch: not a multiple of K
			stopAfter := 11 + 5 // epoch 1, micro-batch 5: one into a cycle
			require.NotZero(t, stopAfter%k)
			dir := t.TempDir()
			straight := make([][32]byte, ranks)
			resumed := make([][32]byte, ranks)
			opts := []accel.Option{accel.WithGradientAccumulationSteps(k), accel.WithSeed(7), accel.WithSharding(tc.sharding)}
			if tc.powerSGD {
				// Compressed from the second sync on: the checkpoint holds error feedback and Qs.
				opts = append(opts, accel.WithPowerSGD(accumulate.PowerSGDConfig{Rank: 1, StartIter: 1}))
			}

			runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
				r := prepareResumable(t, acc, n, b, 1)
				if _, err := r.train(acc, epochs, 0); err != nil {
					return err
				}
				var err error
				straight[rank], err = replicas.VariablesDigest(r.model.ReplicatedVariables())
				return err
			})
			var steps int64
			runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
				r := prepareResumable(t, acc, n, b, 1)
				if ran, err := r.train(acc, epochs, stopAfter); err != nil || ran != stopAfter {
					return fmt.Errorf("first half ran %d micro-batches: %v", ran, err)
				}
				if rank == 0 { // every rank takes the same steps
					steps = r.opt.Steps()
				}
				_, err := acc.SaveState(dir)
				return err
			})
			runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
				r := prepareResumable(t, acc, n, b, 1)
				if err := acc.LoadState(dir); err != nil {
					return err
				}
				if r.opt.Steps() != steps || r.loader.Epoch() != 1 || r.loader.Position() != 5 {
					return fmt.Errorf("restored steps=%d epoch=%d position=%d, want %d, 1, 5", r.opt.Steps(),
						r.loader.Epoch(), r.loader.Position(), steps)
				}
				ran, err := r.train(acc, epochs, 0)
				if err != nil {
					return err
				}
				if ran != 2*11-stopAfter {
					return fmt.Errorf("resumed run ran %d micro-batches, want %d", ran, 2*11-stopAfter)
				}
				resumed[rank], err = replicas.VariablesDigest(r.model.ReplicatedVariables())
				return err
			})
			assert.Equal(t, straight, resumed)
			assert.Equal(t, straight[0], straight[ranks-1])
		})
	}
}

// TestLoadStateRefusesWhatDoesNotFit: what a run cannot continue is refused with what differs. A
// checkpoint at an optimizer-step boundary fits any world size and K (TestResumeOnAnotherWorldSize); one
// inside a cycle, saved here, only the same (TestInsideCycleCheckpointOnAnotherWorldSize).
func TestLoadStateRefusesWhatDoesNotFit(t *testing.T) {
	dir := t.TempDir()
	runRanks(t, 2, []accel.Option{accel.WithGradientAccumulationSteps(2)}, func(rank int, acc *accel.Accelerator) error {
		r := prepareResumable(t, acc, 8, 2, 1)
		if _, err := r.train(acc, 1, 1); err != nil {
			return err
		}
		_, err := acc.SaveState(dir)
		return err
	})
	for _, tc := range []struct {
		name string
		opts []accel.Option
		want string
	}{
		{"world size", []accel.Option{accel.WithGradientAccumulationSteps(2)}, "saved by 2 processes and this run has 1"},
		{"seed", []accel.Option{accel.WithGradientAccumulationSteps(2), accel.WithSeed(3)}, "saved with seed 42, this run uses 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acc := newSingle(t, tc.opts...)
			prepareResumable(t, acc, 8, 2, 1)
			err := acc.LoadState(dir)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	single := t.TempDir()
	acc := newSingle(t, accel.WithGradientAccumulationSteps(3))
	r := prepareResumable(t, acc, 8, 2, 1)
	_, err := r.train(acc, 1, 2)
	require.NoError(t, err)
	_, err = acc.SaveState(single)
	require.NoError(t, err)
	t.Run("accumulation", func(t *testing.T) {
		acc := newSingle(t, accel.WithGradientAccumulationSteps(2))
		prepareResumable(t, acc, 8, 2, 1)
		err := acc.LoadState(single)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "saved with 3 accumulation steps and this run uses 2")
	})
	t.Run("dataset", func(t *testing.T) {
		acc := newSingle(t, accel.WithGradientAccumulationSteps(3))
		prepareResumable(t, acc, 10, 2, 1)
		err := acc.LoadState(single)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "had 8 examples in the saved run, 10 in this one: the dataset differs")
	})
	t.Run("other model", func(t *testing.T) {

		other := newSingle(t)
		model, err := other.PrepareModel(context.New(), wideMLP, testmodel.Loss)
		require.NoError(t, err)
		x, y := testmodel.Data(4, 1)
		require.NoError(t, model.Materialize(prepare.Batch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}))
		err = other.LoadState(single)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "differs from the saved one")
	})
	t.Run("no checkpoint", func(t *testing.T) {
		acc := newSingle(t)
		prepareResumable(t, acc, 8, 2, 1)
		err := acc.LoadState(t.TempDir())
		require.Error(t, err)
		assert.Contains(t, err.Error(), "no checkpoint")
		assert.ErrorIs(t, err, checkpoint.ErrNoCheckpoint)
	})
	t.Run("damaged file", func(t *testing.T) {
		latest, err := checkpoint.Latest(single)
		require.NoError(t, err)
		damaged := filepath.Join(t.TempDir(), "copy")
		require.NoError(t, os.CopyFS(damaged, os.DirFS(latest)))
		state := filepath.Join(damaged, "state.json")
		data, err := os.ReadFile(state)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(state, append(data, ' '), 0o644))
		acc := newSingle(t, accel.WithGradientAccumulationSteps(3))
		prepareResumable(t, acc, 8, 2, 1)
		err = acc.LoadState(damaged)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "damaged")
	})
}

func wideMLP(ctx *context.Context, inputs []*Node) []*Node {
	return testmodel.MLP(ctx.In("wide"), inputs)
}

// saveChildEnv makes the test binary a process that trains and saves checkpoints in a loop forever, for
// the parent to kill.
const saveChildEnv = "GOACCEL_TEST_SAVE_LOOP_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(saveChildEnv); dir != "" {
		saveLoop(dir)
		return
	}
	mpitest.Main(m)
}

// saveLoop trains a model large enough that writing a checkpoint takes a while, saving after every step.
func saveLoop(dir string) {
	acc, err := accel.New(accel.WithBackend("go"), accel.WithCheckpointLimit(2))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	model, err := acc.PrepareModel(context.New(), bigModel, testmodel.Loss)
	if err == nil {
		_, err = acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.Adam))
	}
	x, y := testmodel.Data(2, 1)
	batch := prepare.Batch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}
	for i := 0; err == nil; i++ {
		if _, err = acc.Backward(model, batch); err == nil {
			_, err = acc.Optimizers()[0].Step()
		}
		fmt.Println("saving", i)
		if err == nil {
			_, err = acc.SaveState(dir)
		}
		fmt.Println("saved", i)
	}
	fmt.Println("error:", err)
	os.Exit(1)
}

// bigModel has about 2M parameters (with Adam, 24 MB of state): slow enough to write that a kill lands
// inside a save.
func bigModel(ctx *context.Context, inputs []*Node) []*Node {
	h := layers.Dense(ctx.In("wide"), inputs[0], true, 4096)
	h = layers.Dense(ctx.In("wider"), Tanh(h), true, 512)
	return []*Node{layers.Dense(ctx.In("output"), h, true, testmodel.Classes)}
}

// TestKillDuringSave really sends SIGKILL to a process while it saves, several times, and checks that
// the newest checkpoint left behind always loads.
func TestKillDuringSave(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 4 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), saveChildEnv+"="+dir, "GOMLX_BACKEND=go")
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		lines := bufio.NewScanner(stdout)
		// Wait until the child is inside a save after at least one finished, then kill it at a random moment.
		savedOnce := round > 0
		for lines.Scan() {
			line := lines.Text()
			require.False(t, strings.HasPrefix(line, "error:"), line)
			if strings.HasPrefix(line, "saved") {
				savedOnce = true
			}
			if savedOnce && strings.HasPrefix(line, "saving") {
				break
			}
		}
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()

		latest, err := checkpoint.Latest(dir)
		require.NoError(t, err, "round %d", round)
		_, err = checkpoint.Verify(latest)
		require.NoError(t, err, "round %d: newest checkpoint %s", round, latest)

		acc := newSingle(t)
		model, err := acc.PrepareModel(context.New(), bigModel, testmodel.Loss)
		require.NoError(t, err)
		_, err = acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.Adam))
		require.NoError(t, err)
		x, y := testmodel.Data(2, 1)
		require.NoError(t, model.Materialize(prepare.Batch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}))
		require.NoError(t, acc.LoadState(dir), "round %d", round)
		assert.Positive(t, acc.Optimizers()[0].Steps())
	}
}
