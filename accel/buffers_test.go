package accel_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/batchnorm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// batchNormMLP is testmodel's classifier with batchnorm.New on its hidden layer: its moving mean, variance
// and update count are buffers, which every training forward updates from the rank's own batch.
func batchNormMLP(ctx *context.Context, in []*Node) []*Node {
	h := layers.Dense(ctx.In("hidden"), in[0], true, testmodel.Hidden)
	h = Tanh(batchnorm.New(ctx.In("hidden"), h, -1).Done())
	return []*Node{layers.Dense(ctx.In("output"), h, true, testmodel.Classes)}
}

// bufferLoop is how a buffer run reaches its optimizer steps.
type bufferLoop int

const (
	// accumulateLoop: every micro-batch inside Accumulate (K is the accelerator's).
	accumulateLoop bufferLoop = iota
	// noSyncLoop: K=1, every even micro-batch inside NoSync and the odd ones outside, at half the loss each.
	noSyncLoop
)

// bufferRun is what one rank of a buffer run reports.
type bufferRun struct {
	// Weights digests the replicated variables, Buffers the model's buffers, at the end.
	Weights, Buffers [32]byte
	// Micro digests the buffers after each micro-batch, and Synced says whether it synced gradients.
	Micro  [][32]byte
	Synced []bool
	// Broadcasts counts the broadcasts from the end of the first optimizer step to the end.
	Broadcasts int64
	Steps      int64
	// Predictions are Predict's outputs for the same examples on every rank.
	Predictions []float32
	// CheckReplicas is acc.CheckReplicas's error, and BufferCheck a bitwise comparison of the buffers alone
	// ("" when they agree).
	CheckReplicas, BufferCheck string
}

// bufferPredictInputs are the examples every rank predicts.
func bufferPredictInputs() *tensors.Tensor {
	x, _ := testmodel.Data(5, 99)
	return x
}

// trainBuffers trains batchNormMLP with Adam for the given optimizer steps on batches of 4 examples per
// rank, each rank on its own examples, and reports.
func trainBuffers(acc *accel.Accelerator, loop bufferLoop, steps int) (bufferRun, error) {
	var run bufferRun
	const b = 4
	model, err := acc.PrepareModel(context.New(), batchNormMLP, testmodel.Loss)
	if err != nil {
		return run, err
	}
	opt, err := acc.PrepareOptimizer(model, dropoutAdam())
	if err != nil {
		return run, err
	}
	k := acc.GradientAccumulationSteps()
	if loop == noSyncLoop {
		k = 2
	}
	x, y := testmodel.Data(acc.WorldSize()*k*b*steps, 31)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	if err != nil {
		return run, err
	}
	loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(b))
	if err != nil {
		return run, err
	}
	var broadcastsAfterFirst int64
	i := 0
	for batch, err := range loader.All() {
		if err != nil {
			return run, err
		}
		var synced bool
		microBatch := func(opts ...accel.BackwardOption) error {
			if _, err := acc.Backward(model, batch, opts...); err != nil {
				return err
			}
			synced = acc.SyncGradients()
			if _, err := opt.Step(); err != nil {
				return err
			}
			return opt.ZeroGrad()
		}
		switch {
		case loop == accumulateLoop:
			err = acc.Accumulate(func() error { return microBatch() })
		case i%2 == 0:
			err = acc.NoSync(func() error { return microBatch(accel.LossScale(0.5)) })
		default:
			err = microBatch(accel.LossScale(0.5))
		}
		if err != nil {
			return run, err
		}
		d, err := replicas.VariablesDigest(model.Buffers())
		if err != nil {
			return run, err
		}
		run.Micro, run.Synced = append(run.Micro, d), append(run.Synced, synced)
		if opt.Steps() == 1 && synced {
			broadcastsAfterFirst = acc.Stats().Collectives.Of(backends.OpBroadcast).Calls
		}
		i++
	}
	run.Broadcasts = acc.Stats().Collectives.Of(backends.OpBroadcast).Calls - broadcastsAfterFirst
	run.Steps = opt.Steps()
	if run.Weights, err = replicas.VariablesDigest(model.ReplicatedVariables()); err != nil {
		return run, err
	}
	if run.Buffers, err = replicas.VariablesDigest(model.Buffers()); err != nil {
		return run, err
	}
	run.CheckReplicas = errorString(acc.CheckReplicas(model))
	run.BufferCheck = errorString(replicas.CheckReplicasInSync(acc.Communicator(), model.Buffers()))
	out, err := model.Predict(bufferPredictInputs())
	if err != nil {
		return run, err
	}
	run.Predictions = tensors.MustCopyFlatData[float32](out[0])
	return run, nil
}

func errorString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// checkBufferRanks checks the ranks' reports of one run: with synchronised buffers (sync true) every rank
// holds rank 0's buffers after each micro-batch that synced, and its own after the others; the replica
// check passes, every rank predicts the same, and one broadcast per optimizer step carries the buffers
// (broadcast mode). Without, the buffers differ after every micro-batch and so do the predictions, while
// the replica checks, which leave per-rank buffers out, still pass.
func checkBufferRanks(t *testing.T, runs []bufferRun, steps int64, sync bool, broadcasts bool) {
	t.Helper()
	for r, run := range runs {
		assert.Equal(t, steps, run.Steps, "rank %d's optimizer steps", r)
		assert.Empty(t, run.CheckReplicas, "rank %d", r)
		assert.Equal(t, runs[0].Weights, run.Weights, "rank %d's replicated variables", r)
		require.Len(t, run.Micro, len(runs[0].Micro), "rank %d", r)
		if r == 0 {
			continue
		}
		for i, synced := range run.Synced {
			assert.Equal(t, runs[0].Synced[i], synced, "rank %d, micro-batch %d", r, i)
			if sync && synced {
				assert.Equal(t, runs[0].Micro[i], run.Micro[i], "rank %d's buffers after micro-batch %d, which synced", r, i)
			} else {
				assert.NotEqual(t, runs[0].Micro[i], run.Micro[i], "rank %d's buffers after micro-batch %d", r, i)
			}
		}
		if sync {
			assert.Empty(t, run.BufferCheck, "rank %d", r)
			assert.Equal(t, runs[0].Buffers, run.Buffers, "rank %d's buffers", r)
			assert.Equal(t, runs[0].Predictions, run.Predictions, "rank %d's predictions", r)
		} else {
			assert.Contains(t, run.BufferCheck, "batch_normalization", "rank %d", r)
			assert.NotEqual(t, runs[0].Buffers, run.Buffers, "rank %d's buffers", r)
			assert.NotEqual(t, runs[0].Predictions, run.Predictions, "rank %d's predictions", r)
		}
	}
	if broadcasts {
		for r, run := range runs {
			assert.Equal(t, steps-1, run.Broadcasts, "rank %d: one broadcast per optimizer step", r)
		}
	}
}

// bufferCases are the loops and modes the buffer tests run: K=1, K=2, K=2 with sync-each-batch, NoSync,
// and K=2 averaging and not synchronising the buffers.
var bufferCases = []struct {
	name string
	loop bufferLoop
	opts []accel.Option
	mode accel.BufferSync
}{
	{"K=1", accumulateLoop, nil, accel.BroadcastBuffers},
	{"K=2", accumulateLoop, []accel.Option{accel.WithGradientAccumulationSteps(2)}, accel.BroadcastBuffers},
	{"K=2/sync-each-batch", accumulateLoop, []accel.Option{accel.WithGradientAccumulationSteps(2),
		accel.WithSyncEachBatch()}, accel.BroadcastBuffers},
	{"NoSync", noSyncLoop, nil, accel.BroadcastBuffers},
	{"K=2/average", accumulateLoop, []accel.Option{accel.WithGradientAccumulationSteps(2),
		accel.WithBufferSync(accel.AverageBuffers)}, accel.AverageBuffers},
	{"K=2/no-buffer-sync", accumulateLoop, []accel.Option{accel.WithGradientAccumulationSteps(2),
		accel.WithBufferSync(accel.NoBufferSync)}, accel.NoBufferSync},
}

// TestBuffersAcrossRanks: batch normalisation's moving averages stay identical on 2 and 4 in-process
// ranks, with the replica check after every optimizer step (docs/semantics.md §12): after every micro-batch
// an optimizer step follows — with K=1, K=2, sync-each-batch (whose other all-reduces leave the buffers
// alone) and after NoSync — every rank holds rank 0's buffers (one broadcast per step) or, with
// AverageBuffers, their mean; CheckReplicas passes and Predict answers the same on every rank. With
// NoBufferSync the buffers differ, as every rank's did before they were synchronised, and so do the
// predictions.
func TestBuffersAcrossRanks(t *testing.T) {
	const steps = 3
	for _, ranks := range []int{2, 4} {
		for _, c := range bufferCases {
			t.Run(fmt.Sprintf("ranks=%d/%s", ranks, c.name), func(t *testing.T) {
				runs := make([]bufferRun, ranks)
				opts := append([]accel.Option{accel.WithSeed(5), accel.WithReplicaCheck()}, c.opts...)
				runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
					var err error
					runs[rank], err = trainBuffers(acc, c.loop, steps)
					return err
				})
				checkBufferRanks(t, runs, steps, c.mode != accel.NoBufferSync, c.mode == accel.BroadcastBuffers)
			})
		}
	}
}

// TestBufferSyncIsASetting: processes with different buffer modes are refused on the first Backward,
// naming the setting, and New refuses a mode outside the three.
func TestBufferSyncIsASetting(t *testing.T) {
	_, err := accel.New(accel.WithBackend("go"), accel.WithBufferSync(accel.BufferSync(9)))
	require.ErrorContains(t, err, "buffer sync")
	comms, err := backends.NewInProcessGroup(2)
	require.NoError(t, err)
	errs := make([]error, 2)
	done := make(chan struct{})
	for r := range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			mode := accel.BroadcastBuffers
			if r == 1 {
				mode = accel.AverageBuffers
			}
			acc, err := accel.New(accel.WithCommunicator(comms[r]), accel.WithBackend("go"), accel.WithBufferSync(mode))
			if err != nil {
				errs[r] = err
				return
			}
			defer acc.Close()
			_, errs[r] = trainBuffers(acc, accumulateLoop, 1)
		}()
	}
	<-done
	<-done
	for r, err := range errs {
		require.ErrorContains(t, err, "buffer sync", "rank %d", r)
	}
}

// bufferResumable trains batchNormMLP from a shuffled loader of n examples, batch 4, for the resume tests.
type bufferResumable struct {
	model  *prepare.Model
	opt    *prepare.Optimizer
	loader *prepare.DataLoader
}

func prepareBufferResumable(acc *accel.Accelerator, n int) (bufferResumable, error) {
	var r bufferResumable
	var err error
	if r.model, err = acc.PrepareModel(context.New(), batchNormMLP, testmodel.Loss); err != nil {
		return r, err
	}
	if r.opt, err = acc.PrepareOptimizer(r.model, dropoutAdam()); err != nil {
		return r, err
	}
	x, y := testmodel.Data(n, 37)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	if err != nil {
		return r, err
	}
	r.loader, err = acc.PrepareDataLoader(src, prepare.BatchSize(4), prepare.Shuffle())
	return r, err
}

// train runs from the loader's place to the end of epochs, stopping after stopAfter micro-batches (> 0).
func (r bufferResumable) train(acc *accel.Accelerator, epochs, stopAfter int) error {
	return dropoutResumable{model: r.model, opt: r.opt, loader: r.loader}.train(acc, epochs, stopAfter)
}

// bufferState is one rank's state at the end of a resume phase.
type bufferState struct {
	Weights, Buffers [32]byte
	// Values are the buffers' values, by name.
	Values      map[string][]float32
	Predictions []float32
}

func (r bufferResumable) report() (bufferState, error) {
	s := bufferState{Values: map[string][]float32{}}
	var err error
	if s.Weights, err = replicas.VariablesDigest(r.model.ReplicatedVariables()); err != nil {
		return s, err
	}
	if s.Buffers, err = replicas.VariablesDigest(r.model.Buffers()); err != nil {
		return s, err
	}
	for _, v := range r.model.Buffers() {
		t, err := v.Value()
		if err != nil {
			return s, err
		}
		s.Values[v.ParameterName()] = tensors.MustCopyFlatData[float32](t)
	}
	out, err := r.model.Predict(bufferPredictInputs())
	if err != nil {
		return s, err
	}
	s.Predictions = tensors.MustCopyFlatData[float32](out[0])
	return s, nil
}

// bufferPhase runs one resume phase on ranks in-process ranks: load (if any), train to the end of epochs or
// stop micro-batches (none when stop < 0), save into save (if any), report.
func bufferPhase(t *testing.T, ranks, n int, opts []accel.Option, load, save string, stop int) []bufferState {
	t.Helper()
	states := make([]bufferState, ranks)
	runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
		r, err := prepareBufferResumable(acc, n)
		if err != nil {
			return err
		}
		if load != "" {
			if err := acc.LoadState(load); err != nil {
				return err
			}
		}
		if stop >= 0 {
			if err := r.train(acc, 2, stop); err != nil {
				return err
			}
		}
		if save != "" {
			if _, err := acc.SaveState(save); err != nil {
				return err
			}
		}
		states[rank], err = r.report()
		return err
	})
	return states
}

// checkpointBuffers reads the buffers' values from the newest checkpoint under dir.
func checkpointBuffers(t *testing.T, dir string, names []string) map[string][]float32 {
	t.Helper()
	path, err := checkpoint.Latest(dir)
	require.NoError(t, err)
	h, err := checkpoints.Load(context.New()).Dir(filepath.Join(path, "model-0")).ExcludeAllParams().Done()
	require.NoError(t, err)
	loaded := h.LoadedVariables()
	values := map[string][]float32{}
	for _, name := range names {
		v, ok := loaded[name]
		require.True(t, ok, "the checkpoint holds %s", name)
		values[name] = tensors.MustCopyFlatData[float32](v)
	}
	return values
}

// TestBufferCheckpoints: checkpoints hold the buffers. On 2 in-process ranks (K=2), a run saved at an
// optimizer-step boundary and one saved inside an accumulation cycle hold rank 0's buffers, which every
// rank holds at the boundary; both resume in fresh accelerators to bitwise the weights, buffers and
// predictions of the run that never stopped (inside a cycle the other ranks resume with rank 0's buffers,
// which the cycle's broadcast overwrites as it would have). The boundary checkpoint loads on 1 and 3 ranks
// with the saved buffers on every rank.
func TestBufferCheckpoints(t *testing.T) {
	const ranks, n = 2, 2 * 4 * 5 // five micro-batches per rank and epoch: the epoch ends inside a cycle
	opts := []accel.Option{accel.WithGradientAccumulationSteps(2), accel.WithSeed(11)}
	boundary, mid := t.TempDir(), t.TempDir()
	straight := bufferPhase(t, ranks, n, opts, "", "", 0)
	atBoundary := bufferPhase(t, ranks, n, opts, "", boundary, 4)
	inCycle := bufferPhase(t, ranks, n, opts, "", mid, 6) // the first micro-batch of epoch 1's first cycle

	names := slices.Sorted(func(yield func(string) bool) {
		for name := range straight[0].Values {
			if !yield(name) {
				return
			}
		}
	})
	require.Len(t, names, 3, "mean, variance and avg_weight")
	assert.Equal(t, atBoundary[0].Values, atBoundary[1].Values, "at a step boundary every rank holds rank 0's")
	assert.Equal(t, atBoundary[0].Values, checkpointBuffers(t, boundary, names))
	assert.NotEqual(t, inCycle[0].Values, inCycle[1].Values, "inside a cycle each rank updated its own")
	assert.Equal(t, inCycle[0].Values, checkpointBuffers(t, mid, names))

	for _, dir := range []string{boundary, mid} {
		resumed := bufferPhase(t, ranks, n, opts, dir, "", 0)
		assert.Equal(t, straight, resumed, "resumed from %s: the run must end bitwise as the straight one", dir)
	}
	for _, other := range []int{1, 3} {
		t.Run(fmt.Sprintf("ranks=%d", other), func(t *testing.T) {
			loaded := bufferPhase(t, other, n, opts, boundary, "", -1)
			for r := range other {
				assert.Equal(t, atBoundary[0].Values, loaded[r].Values, "rank %d's buffers", r)
				assert.Equal(t, atBoundary[0].Weights, loaded[r].Weights, "rank %d's weights", r)
				assert.Equal(t, atBoundary[0].Predictions, loaded[r].Predictions, "rank %d's predictions", r)
			}
		})
	}
}
