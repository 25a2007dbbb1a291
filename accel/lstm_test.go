package accel_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/lstm"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/prepare"
)

// The sine task: from sineSteps samples of a sine of random frequency and phase, predict the next sample.
const (
	sineSteps    = 8
	sineExamples = 64
	sineBatch    = 16 // the global batch: each of N processes takes sineBatch/N examples
	sineEpochs   = 40
	// sineTarget is the mean squared error the LSTM must reach. Predicting 0 scores 0.5 and repeating the
	// last sample about 0.1.
	sineTarget = 0.01
)

// sineData returns n sequences [n, sineSteps, 1] of sin(w·t + φ), w in [0.3, 0.8), and their next
// samples [n, 1].
func sineData(n int, seed uint64) (x, y *tensors.Tensor) {
	rng := rand.New(rand.NewPCG(seed, 11))
	xs := make([]float32, n*sineSteps)
	ys := make([]float32, n)
	for i := range n {
		w, phase := 0.3+0.5*rng.Float64(), 2*math.Pi*rng.Float64()
		for t := range sineSteps {
			xs[i*sineSteps+t] = float32(math.Sin(w*float64(t) + phase))
		}
		ys[i] = float32(math.Sin(w*sineSteps + phase))
	}
	return tensors.FromFlatDataAndDimensions(xs, n, sineSteps, 1), tensors.FromFlatDataAndDimensions(ys, n, 1)
}

// sineLSTM reads the sequence with an LSTM and predicts the next sample from its last hidden state.
func sineLSTM(ctx *context.Context, in []*graph.Node) []*graph.Node {
	_, last, _ := lstm.New(ctx.In("lstm"), in[0], 12).Done() // [1, b, 12]
	h := graph.Reshape(last, -1, 12)
	return []*graph.Node{layers.Dense(ctx.In("output"), h, true, 1)}
}

// sineRun is what one process reports after training the sine task.
type sineRun struct {
	first, final float64 // the mean squared error over all examples before and after training
	steps        int64
}

// trainSine trains sineLSTM on acc's share of the sine examples for sineEpochs epochs with Adam, and
// measures it on every example before and after (Predict).
func trainSine(acc *accel.Accelerator) (sineRun, error) {
	var run sineRun
	x, y := sineData(sineExamples, 5)
	model, err := acc.PrepareModel(context.New(), sineLSTM, losses.MeanSquaredError)
	if err != nil {
		return run, err
	}
	opt, err := acc.PrepareOptimizer(model, optimizers.Adam().LearningRate(0.02).Done())
	if err != nil {
		return run, err
	}
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	if err != nil {
		return run, err
	}
	loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(sineBatch/acc.WorldSize()), prepare.Shuffle())
	if err != nil {
		return run, err
	}
	first, err := loader.PeekBatch()
	if err == nil {
		err = model.Materialize(first)
	}
	if err != nil {
		return run, err
	}
	if run.first, err = sineError(model, x, y); err != nil {
		return run, err
	}
	for epoch := range sineEpochs {
		loader.SetEpoch(epoch)
		for batch, err := range loader.All() {
			if err != nil {
				return run, err
			}
			if _, err := acc.Backward(model, batch); err != nil {
				return run, err
			}
			if _, err := opt.Step(); err != nil {
				return run, err
			}
			if err := opt.ZeroGrad(); err != nil {
				return run, err
			}
		}
	}
	run.steps = opt.Steps()
	if run.final, err = sineError(model, x, y); err != nil {
		return run, err
	}
	return run, acc.CheckReplicas(model)
}

// sineError is the model's mean squared error over the examples (x, y).
func sineError(model *prepare.Model, x, y *tensors.Tensor) (float64, error) {
	out, err := model.Predict(x)
	if err != nil {
		return 0, err
	}
	predictions := tensors.MustCopyFlatData[float32](out[0])
	labels := tensors.MustCopyFlatData[float32](y)
	if len(predictions) != len(labels) {
		return 0, fmt.Errorf("%d predictions for %d labels", len(predictions), len(labels))
	}
	var sum float64
	for i, p := range predictions {
		d := float64(p - labels[i])
		sum += d * d
	}
	return sum / float64(len(labels)), nil
}

// TestLSTMLearnsSine: an LSTM (lstm.New) learns to continue sines through the Accelerator, to a mean
// squared error under sineTarget from over 20 times that, on 1 process and on 2 in-process ranks with the
// same global batch; the ranks end with identical weights (CheckReplicas), and both runs reach about the
// same error, as the same optimizer steps on the same global batches.
func TestLSTMLearnsSine(t *testing.T) {
	wantSteps := int64(sineEpochs * sineExamples / sineBatch)
	acc := newSingle(t, accel.WithSeed(9))
	single, err := trainSine(acc)
	require.NoError(t, err)
	t.Logf("1 process: mean squared error %.4f → %.7f in %d steps", single.first, single.final, single.steps)
	require.Equal(t, wantSteps, single.steps)
	assert.Greater(t, single.first, 20*sineTarget, "the task is too easy to show learning")
	assert.Less(t, single.final, sineTarget, "1 process")

	runs := make([]sineRun, 2)
	runRanks(t, 2, []accel.Option{accel.WithSeed(9)}, func(rank int, acc *accel.Accelerator) error {
		var err error
		runs[rank], err = trainSine(acc)
		return err
	})
	for rank, run := range runs {
		t.Logf("rank %d of 2: mean squared error %.4f → %.7f in %d steps", rank, run.first, run.final, run.steps)
		require.Equal(t, wantSteps, run.steps, "rank %d", rank)
		assert.Less(t, run.final, sineTarget, "rank %d", rank)
		assert.Equal(t, runs[0].final, run.final, "rank %d predicts differently from rank 0", rank)
	}
	assert.Equal(t, single.first, runs[0].first, "the runs start from different weights")
	assert.InEpsilon(t, single.final, runs[0].final, 0.1, "1 and 2 processes end far apart")
}

// TestMeasuredOpsScheduleChangesNoValue: with two compute threads the pure-Go backend's schedule is chosen
// by timing the first micro-batches both ways (accel env then says "measured"); the model ends with the
// same error, bit for bit, as on one thread, whose operations always run one after another.
func TestMeasuredOpsScheduleChangesNoValue(t *testing.T) {
	train := func(threads int) sineRun {
		acc, err := accel.New(accel.WithComputeThreads(threads))
		require.NoError(t, err)
		defer func() { require.NoError(t, acc.Close()) }()
		run, err := trainSine(acc)
		require.NoError(t, err)
		return run
	}
	measured := train(2)
	if cpu.OpsMeasurable() {
		assert.Contains(t, cpu.CurrentKernels().Ops, "(measured)")
	} else { // the race detector's builds always run one operation after another
		assert.Equal(t, "sequential", cpu.CurrentKernels().Ops)
	}
	sequential := train(1)
	assert.Equal(t, "sequential", cpu.CurrentKernels().Ops)
	assert.Equal(t, sequential.final, measured.final, "the schedule changed a value")
	assert.Less(t, measured.final, sineTarget)
}
