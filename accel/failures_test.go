package accel_test

import (
	"math"
	"testing"
	"time"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

func batchOf(x, y *tensors.Tensor) prepare.Batch {
	return prepare.Batch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}
}

// nanOnRank returns a batch whose first input is NaN when poisoned.
func nanBatch(poisoned bool) prepare.Batch {
	x, y := testmodel.Data(4, 2)
	if poisoned {
		tensors.MustMutableFlatData(x, func(flat []float32) { flat[0] = float32(math.NaN()) })
	}
	return batchOf(x, y)
}

// TestNonFinitePolicyIsAgreedByAllRanks: a NaN loss on one rank only makes every rank take the same
// decision (skip, or fail) and leaves the replicas identical.
func TestNonFinitePolicyIsAgreedByAllRanks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy prepare.NonFinitePolicy
	}{{"skip", prepare.NonFiniteSkip}, {"fail", prepare.NonFiniteFail}} {
		t.Run(tc.name, func(t *testing.T) {
			before := make([][32]byte, 2)
			after := make([][32]byte, 2)
			runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
				model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
				require.NoError(t, err)
				opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.SGD), prepare.OnNonFinite(tc.policy))
				require.NoError(t, err)
				// One clean step, then one where rank 1's loss is NaN.
				_, err = acc.Backward(model, nanBatch(false))
				require.NoError(t, err)
				stepped, err := opt.Step()
				require.NoError(t, err)
				require.True(t, stepped)
				before[rank], err = replicas.VariablesDigest(model.Parameters())
				require.NoError(t, err)

				loss, err := acc.Backward(model, nanBatch(rank == 1))
				require.NoError(t, err)
				assert.Equal(t, rank == 1, math.IsNaN(loss), "rank %d loss %g", rank, loss)
				stepped, err = opt.Step()
				assert.False(t, stepped, "rank %d", rank)
				if tc.policy == prepare.NonFiniteFail {
					var nf *prepare.NonFiniteError
					require.ErrorAs(t, err, &nf, "rank %d", rank)
					assert.EqualValues(t, 2, nf.Step)
					assert.Equal(t, []int{1}, nf.Ranks, "rank %d must learn which rank had the NaN", rank)
					assert.ErrorContains(t, err, "rank 1's loss was NaN or Inf")
				} else {
					require.NoError(t, err)
					assert.EqualValues(t, 1, opt.SkippedSteps())
				}
				after[rank], err = replicas.VariablesDigest(model.Parameters())
				require.NoError(t, err)

				// Training goes on normally afterwards.
				_, err = acc.Backward(model, nanBatch(false))
				require.NoError(t, err)
				stepped, err = opt.Step()
				require.NoError(t, err)
				assert.True(t, stepped)
				return acc.CheckReplicas(model)
			})
			assert.Equal(t, before, after, "weights must be untouched by the refused step")
		})
	}
}

// TestCollectiveWatchdog: a rank that stops taking part makes the others fail within the timeout with an
// error naming the operation and the optimizer step, instead of hanging.
func TestCollectiveWatchdog(t *testing.T) {
	const timeout = 500 * time.Millisecond
	var survivorErr error
	var elapsed time.Duration
	comms, err := backends.NewInProcessGroup(2)
	require.NoError(t, err)
	done := make(chan struct{}, 2)
	for r := range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			acc, err := accel.New(accel.WithCommunicator(comms[r]), accel.WithBackend("go"),
				accel.WithCollectiveTimeout(timeout))
			require.NoError(t, err)
			model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			_, err = acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.SGD))
			require.NoError(t, err)
			require.NoError(t, model.Materialize(nanBatch(false)))
			// A first Backward on both ranks (the ranks compare their settings there), without a sync.
			_, err = backwardNoSync(acc, model, nanBatch(false))
			require.NoError(t, err)
			if r == 1 {
				return // this rank is "stuck": it never joins the gradient sync
			}
			start := time.Now()
			_, survivorErr = acc.Backward(model, nanBatch(false))
			elapsed = time.Since(start)
		}()
	}
	<-done
	<-done
	var timeoutErr *backends.TimeoutError
	require.ErrorAs(t, survivorErr, &timeoutErr)
	assert.Equal(t, backends.OpAllReduce, timeoutErr.Op)
	assert.Contains(t, survivorErr.Error(), "all-reduce")
	assert.Contains(t, survivorErr.Error(), "optimizer step 1")
	assert.Less(t, elapsed, 10*timeout, "the watchdog must fire close to its timeout")
	assert.GreaterOrEqual(t, elapsed, timeout)
}

type lossOnlyOptimizer struct{}

func (lossOnlyOptimizer) UpdateGraph(*context.Context, *Graph, *Node) {}
func (lossOnlyOptimizer) Clear(*context.Context) error                { return nil }

var _ optimizers.Interface = lossOnlyOptimizer{}

// TestMisuseReturnsErrors: each misuse gives an error that says what is wrong; nothing panics out.
func TestMisuseReturnsErrors(t *testing.T) {
	x, y := testmodel.Data(4, 1)
	good := batchOf(x, y)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, acc *accel.Accelerator) error
		want string
	}{
		{"backward on an unprepared model", func(t *testing.T, acc *accel.Accelerator) error {
			other := newSingle(t)
			m, err := other.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			_, err = acc.Backward(m, good)
			return err
		}, "not prepared by this accelerator"},
		{"nil model", func(t *testing.T, acc *accel.Accelerator) error {
			_, err := acc.Backward(nil, good)
			return err
		}, "model is nil"},
		{"nested Accumulate", func(t *testing.T, acc *accel.Accelerator) error {
			return acc.Accumulate(func() error { return acc.Accumulate(func() error { return nil }) })
		}, "inside Accumulate"},
		{"nil Accumulate body", func(t *testing.T, acc *accel.Accelerator) error {
			return acc.Accumulate(nil)
		}, "nil function"},
		{"nil NoSync body", func(t *testing.T, acc *accel.Accelerator) error {
			return acc.NoSync(nil)
		}, "nil function"},
		{"features change between batches", func(t *testing.T, acc *accel.Accelerator) error {
			m, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			_, err = backwardNoSync(acc, m, good)
			require.NoError(t, err)
			_, err = backwardNoSync(acc, m, batchOf(tensors.FromShape(x.Shape().Clone()), y))
			require.NoError(t, err, "same shape is fine")
			wide := tensors.FromFlatDataAndDimensions(make([]float32, 4*7), 4, 7)
			_, err = backwardNoSync(acc, m, batchOf(wide, y))
			return err
		}, "only the batch (first) dimension may change"},
		{"labels change dtype", func(t *testing.T, acc *accel.Accelerator) error {
			m, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			_, err = backwardNoSync(acc, m, good)
			require.NoError(t, err)
			_, err = backwardNoSync(acc, m, batchOf(x, tensors.FromFlatDataAndDimensions(make([]float32, 4), 4, 1)))
			return err
		}, "labels #0 has dtype Float32"},
		{"inputs and labels disagree on the batch size", func(t *testing.T, acc *accel.Accelerator) error {
			m, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			_, err = backwardNoSync(acc, m, good)
			require.NoError(t, err)
			_, err = backwardNoSync(acc, m, batchOf(x, testmodel.Rows(y, 0, 3)))
			return err
		}, "labels #0 has 3 examples"},
		{"loss is not a scalar", func(t *testing.T, acc *accel.Accelerator) error {
			m, err := acc.PrepareModel(context.New(), testmodel.MLP, func(labels, predictions []*Node) *Node {
				return ReduceSum(predictions[0], -1)
			})
			require.NoError(t, err)
			_, err = acc.Backward(m, good)
			return err
		}, "the loss must be a scalar"},
		{"model function panics", func(t *testing.T, acc *accel.Accelerator) error {
			m, err := acc.PrepareModel(context.New(), func(*context.Context, []*Node) []*Node { panic("model bug") }, testmodel.Loss)
			require.NoError(t, err)
			_, err = acc.Backward(m, good)
			return err
		}, "model bug"},
		{"model without trainable variables", func(t *testing.T, acc *accel.Accelerator) error {
			m, err := acc.PrepareModel(context.New(), func(_ *context.Context, in []*Node) []*Node {
				return []*Node{Slice(in[0], AxisRange(), AxisRange(0, testmodel.Classes))}
			}, testmodel.Loss)
			require.NoError(t, err)
			_, err = acc.Backward(m, good)
			return err
		}, "no trainable variables"},
		{"model larger than the machine's memory", func(t *testing.T, acc *accel.Accelerator) error {
			m, err := acc.PrepareModel(context.New(), func(ctx *context.Context, in []*Node) []*Node {
				return []*Node{layers.Dense(ctx.In("huge"), in[0], true, 2_000_000_000)}
			}, testmodel.Loss)
			require.NoError(t, err)
			_, err = acc.PrepareOptimizer(m, testmodel.NewOptimizer(testmodel.Adam))
			require.NoError(t, err)
			_, err = acc.Backward(m, good)
			return err
		}, "of memory available on this machine: use a smaller batch per process"},
		{"activations larger than the machine's memory", func(t *testing.T, acc *accel.Accelerator) error {
			// Few parameters, but a micro-batch whose activations take 32 GiB per intermediate tensor.
			m, err := acc.PrepareModel(context.New(), func(ctx *context.Context, in []*Node) []*Node {
				wide := BroadcastToDims(in[0], in[0].Shape().Dimensions[0], testmodel.Features, 1<<30)
				h := ReduceSum(Tanh(wide), -1)
				return []*Node{layers.Dense(ctx.In("out"), h, true, testmodel.Classes)}
			}, testmodel.Loss)
			require.NoError(t, err)
			_, err = acc.Backward(m, good)
			return err
		}, "for the activations and gradients of one micro-batch of"},
		{"nil input tensor", func(t *testing.T, acc *accel.Accelerator) error {
			m, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			_, err = acc.Backward(m, prepare.Batch{Inputs: []*tensors.Tensor{nil}, Labels: []*tensors.Tensor{y}})
			return err
		}, "batch input #0 is nil"},
		{"nil label tensor", func(t *testing.T, acc *accel.Accelerator) error {
			m, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			_, err = acc.Backward(m, prepare.Batch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{nil}})
			return err
		}, "batch label #0 is nil"},
		{"Gather of nil", func(t *testing.T, acc *accel.Accelerator) error {
			_, err := acc.Gather(nil)
			return err
		}, "gather: tensor is nil"},
		{"GatherForMetrics of nil", func(t *testing.T, acc *accel.Accelerator) error {
			_, err := acc.GatherForMetrics(nil, good)
			return err
		}, "gather for metrics: tensor is nil"},
		{"Reduce of nil", func(t *testing.T, acc *accel.Accelerator) error {
			_, err := acc.Reduce(nil, accel.Sum)
			return err
		}, "reduce: tensor is nil"},
		{"Broadcast of nil", func(t *testing.T, acc *accel.Accelerator) error {
			return acc.Broadcast(nil, 0)
		}, "broadcast: tensor is nil"},
		{"Broadcast from a rank that does not exist", func(t *testing.T, acc *accel.Accelerator) error {
			return acc.Broadcast(x, 3)
		}, "root 3 is not a rank of this job of 1"},
		{"nil MainProcessFirst body", func(t *testing.T, acc *accel.Accelerator) error {
			return acc.MainProcessFirst(nil)
		}, "main process first: nil function"},
		{"optimizer without UpdateGraphWithGradients", func(t *testing.T, acc *accel.Accelerator) error {
			m, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			_, err = acc.PrepareOptimizer(m, lossOnlyOptimizer{})
			return err
		}, "does not implement UpdateGraphWithGradients"},
		{"backward after a sync that was not applied", func(t *testing.T, acc *accel.Accelerator) error {
			m, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			_, err = acc.PrepareOptimizer(m, testmodel.NewOptimizer(testmodel.SGD))
			require.NoError(t, err)
			_, err = acc.Backward(m, good)
			require.NoError(t, err)
			_, err = acc.Backward(m, good)
			return err
		}, "call the optimizer's Step"},
		{"use after Close", func(t *testing.T, acc *accel.Accelerator) error {
			require.NoError(t, acc.Close())
			_, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			return err
		}, "closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acc := newSingle(t)
			var err error
			require.NotPanics(t, func() { err = tc.run(t, acc) })
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestClipGradNorm: with clipping, one SGD step moves the weights by exactly lr·maxNorm (in L2 norm over
// all parameters) when the gradient is larger than maxNorm, on every rank identically.
func TestClipGradNorm(t *testing.T) {
	const maxNorm, lr = 1e-3, 0.1
	runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
		model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
		require.NoError(t, err)
		opt, err := acc.PrepareOptimizer(model, optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(lr),
			prepare.ClipGradNorm(maxNorm))
		require.NoError(t, err)
		x, y := testmodel.Data(8, uint64(rank+1))
		require.NoError(t, model.Materialize(batchOf(x, y)))
		before := flatParams(t, model)
		_, err = acc.Backward(model, batchOf(x, y))
		require.NoError(t, err)
		_, err = opt.Step()
		require.NoError(t, err)
		after := flatParams(t, model)
		var sq float64
		for i := range before {
			d := after[i] - before[i]
			sq += d * d
		}
		assert.InDelta(t, lr*maxNorm, math.Sqrt(sq), lr*maxNorm*1e-3, "rank %d", rank)
		return acc.CheckReplicas(model)
	})
}

func flatParams(t *testing.T, m *prepare.Model) []float64 {
	var out []float64
	for _, v := range m.Parameters() {
		value, err := v.Value()
		require.NoError(t, err)
		out = append(out, func() []float64 {
			var f []float64
			for _, x := range tensors.MustCopyFlatData[float32](value) {
				f = append(f, float64(x))
			}
			return f
		}()...)
	}
	return out
}

func backwardNoSync(acc *accel.Accelerator, m *prepare.Model, b prepare.Batch) (float64, error) {
	var loss float64
	err := acc.NoSync(func() (err error) {
		loss, err = acc.Backward(m, b)
		return err
	})
	return loss, err
}
