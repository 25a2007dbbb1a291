package prepare_test

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/batchnorm"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/prepare"
)

// batchNormModel normalises its inputs with batchnorm.New — whose moving averages then depend on the data
// alone, so the test can compute them by hand — and its hidden layer with another.
func batchNormModel(ctx *context.Context, in []*Node) []*Node {
	x := batchnorm.New(ctx.In("input"), in[0], -1).Done()
	h := Tanh(layers.Dense(ctx.In("hidden"), x, true, 8))
	h = batchnorm.New(ctx.In("hidden"), h, -1).Done()
	return []*Node{layers.Dense(ctx.In("output"), h, true, 1)}
}

// batchNormMomentum is batchnorm.New's default momentum.
const batchNormMomentum = 0.99

// movingAverages are the input normalisation's moving mean and variance, per feature, with the number of
// updates (batchnorm's avg_weight), as batchnorm.New updates them.
type movingAverages struct {
	mean, variance []float64
	weight         float64
}

func newMovingAverages() movingAverages {
	return movingAverages{mean: make([]float64, dropoutFeatures), variance: slices.Repeat([]float64{1}, dropoutFeatures)}
}

// update is batchnorm.New's update with one batch: the momentum debiased by the number of updates.
func (a movingAverages) update(batch prepare.Batch) movingAverages {
	x := tensors.MustCopyFlatData[float32](batch.Inputs[0])
	n := len(x) / dropoutFeatures
	out := movingAverages{mean: slices.Clone(a.mean), variance: slices.Clone(a.variance), weight: a.weight + 1}
	d := math.Min(batchNormMomentum, 1-1/out.weight)
	for f := range dropoutFeatures {
		var mean, variance float64
		for i := range n {
			mean += float64(x[i*dropoutFeatures+f])
		}
		mean /= float64(n)
		for i := range n {
			diff := float64(x[i*dropoutFeatures+f]) - mean
			variance += diff * diff
		}
		variance /= float64(n)
		out.mean[f] = d*a.mean[f] + (1-d)*mean
		out.variance[f] = d*a.variance[f] + (1-d)*variance
	}
	return out
}

// meanOf averages the ranks' moving averages element by element.
func meanOf(all []movingAverages) movingAverages {
	out := movingAverages{mean: make([]float64, dropoutFeatures), variance: make([]float64, dropoutFeatures)}
	n := float64(len(all))
	for _, a := range all {
		for f := range dropoutFeatures {
			out.mean[f] += a.mean[f]
			out.variance[f] += a.variance[f]
		}
		out.weight += a.weight
	}
	for f := range dropoutFeatures {
		out.mean[f] /= n
		out.variance[f] /= n
	}
	out.weight /= n
	return out
}

// inputAverages reads the input normalisation's buffers of model.
func inputAverages(t *testing.T, model *prepare.Model) movingAverages {
	t.Helper()
	read := func(name string) []float64 {
		v := model.Context().GetVariableByScopeAndName("/input/batch_normalization", name)
		require.NotNil(t, v, name)
		values, err := tensors.CopyFlatData[float32](v.MustValue())
		require.NoError(t, err)
		out := make([]float64, len(values))
		for i, x := range values {
			out[i] = float64(x)
		}
		return out
	}
	weight := read("avg_weight")
	return movingAverages{mean: read("mean"), variance: read("variance"), weight: weight[0]}
}

func assertAverages(t *testing.T, want, got movingAverages, format string, args ...any) {
	t.Helper()
	where := fmt.Sprintf(format, args...)
	assert.Equal(t, want.weight, got.weight, "avg_weight: %s", where)
	for f := range dropoutFeatures {
		assert.InDelta(t, want.mean[f], got.mean[f], 1e-5, "mean[%d]: %s", f, where)
		assert.InDelta(t, want.variance[f], got.variance[f], 1e-5, "variance[%d]: %s", f, where)
	}
}

// bufferBatch is rank r's micro-batch i: every rank and micro-batch has its own examples.
func bufferBatch(r, i int) prepare.Batch { return dropoutBatch(4, 100*r+i) }

// TestBuffersAcrossRanks: batchnorm.New's moving mean, variance and update count are the model's buffers
// (no parameter, optimizer state or generator among them). On 2 and 4 in-process ranks with K=2 and Adam,
// the buffers are synchronised after the forward pass of every micro-batch an optimizer step follows and
// not on the others: with BroadcastBuffers every rank then holds rank 0's moving averages, computed by hand
// from rank 0's batches; with AverageBuffers the mean of every rank's; with NoBufferSync each rank keeps
// its own, the replicated variables leave them out and a bitwise check finds them diverged. Predict then
// answers the same on every rank exactly where the buffers are synchronised.
func TestBuffersAcrossRanks(t *testing.T) {
	const k, steps = 2, 3
	for _, ranks := range []int{2, 4} {
		for _, mode := range []prepare.BufferSync{prepare.BroadcastBuffers, prepare.AverageBuffers, prepare.NoBufferSync} {
			t.Run(fmt.Sprintf("ranks=%d/%s", ranks, mode), func(t *testing.T) {
				rts := dropoutRuntimes(t, ranks, k)
				// got[i][r] are rank r's input averages after micro-batch i.
				got := make([][]movingAverages, k*steps)
				for i := range got {
					got[i] = make([]movingAverages, ranks)
				}
				predictions := make([][]float32, ranks)
				checks := make([]error, ranks)
				names := make([][]string, ranks)
				errs := make([]error, ranks)
				var wg sync.WaitGroup
				for r, rt := range rts {
					wg.Go(func() {
						errs[r] = func() error {
							model, err := prepare.NewModel(rt, context.New(), batchNormModel, losses.MeanSquaredError,
								prepare.BufferSyncMode(mode))
							if err != nil {
								return err
							}
							opt, err := prepare.NewOptimizer(model, optimizers.Adam().LearningRate(0.01).Done())
							if err != nil {
								return err
							}
							for i := range k * steps {
								err := rt.State.Accumulate(func() error {
									if _, err := model.Backward(bufferBatch(r, i), rt.State.MicroBatchScale()); err != nil {
										return err
									}
									if _, err := opt.Step(); err != nil {
										return err
									}
									return opt.ZeroGrad()
								})
								if err != nil {
									return err
								}
								got[i][r] = inputAverages(t, model)
							}
							for _, v := range model.Buffers() {
								names[r] = append(names[r], v.ScopeAndName())
							}
							if mode == prepare.NoBufferSync {
								for _, v := range model.ReplicatedVariables() {
									if slices.Contains(model.Buffers(), v) {
										return fmt.Errorf("buffer %s kept per rank is among the replicated variables", v.ScopeAndName())
									}
								}
							}
							if err := replicas.CheckReplicasInSync(rt.Comm, model.ReplicatedVariables()); err != nil {
								return err
							}
							checks[r] = replicas.CheckReplicasInSync(rt.Comm, model.Buffers())
							out, err := model.Predict(bufferBatch(9, 9).Inputs...)
							if err != nil {
								return err
							}
							predictions[r] = flat(t, out)
							return nil
						}()
						if errs[r] != nil {
							rt.Comm.Abort(1)
						}
					})
				}
				wg.Wait()
				for r, err := range errs {
					require.NoError(t, err, "rank %d", r)
				}
				var want []string
				for _, layer := range []string{"/input", "/hidden"} {
					for _, name := range []string{"mean", "variance", "avg_weight"} {
						want = append(want, layer+"/batch_normalization"+context.ScopeSeparator+name)
					}
				}
				for r := range ranks {
					assert.ElementsMatch(t, want, names[r], "rank %d's buffers", r)
				}

				// Every rank's averages by hand: each starts a cycle from the averages the ranks share, and
				// updates them with its own batches until the step.
				start := newMovingAverages()
				own := make([]movingAverages, ranks)
				for i := range k * steps {
					for r := range ranks {
						if i == 0 || (i%k == 0 && mode != prepare.NoBufferSync) {
							own[r] = start
						}
						own[r] = own[r].update(bufferBatch(r, i))
					}
					if i%k == k-1 {
						switch mode {
						case prepare.BroadcastBuffers:
							start = own[0]
						case prepare.AverageBuffers:
							start = meanOf(own)
						}
					}
					for r := range ranks {
						want := own[r]
						if i%k == k-1 && mode != prepare.NoBufferSync {
							want = start
						}
						assertAverages(t, want, got[i][r], "rank %d after micro-batch %d", r, i)
					}
				}
				if mode == prepare.NoBufferSync {
					// Each rank's own, from the start: what every rank held before buffers were synchronised.
					for r := range ranks {
						mine := newMovingAverages()
						for i := range k * steps {
							mine = mine.update(bufferBatch(r, i))
						}
						assertAverages(t, mine, got[k*steps-1][r], "rank %d's own averages", r)
					}
				}
				for r := range ranks {
					if mode == prepare.NoBufferSync {
						require.Error(t, checks[r], "rank %d", r)
						assert.Contains(t, checks[r].Error(), "batch_normalization")
						if r > 0 {
							assert.NotEqual(t, predictions[0], predictions[r], "rank %d predicts with its own buffers", r)
						}
						continue
					}
					assert.NoError(t, checks[r], "rank %d", r)
					assert.Equal(t, predictions[0], predictions[r], "rank %d's predictions", r)
				}
			})
		}
	}
}

// TestBufferSyncRefusesUnknownModes: a mode outside the three is refused when the model is prepared and
// when SyncBuffers is called.
func TestBufferSyncRefusesUnknownModes(t *testing.T) {
	rt := dropoutRuntimes(t, 1, 1)[0]
	_, err := prepare.NewModel(rt, context.New(), batchNormModel, losses.MeanSquaredError, prepare.BufferSyncMode(7))
	require.ErrorContains(t, err, "buffer sync")
	model, err := prepare.NewModel(rt, context.New(), batchNormModel, losses.MeanSquaredError)
	require.NoError(t, err)
	assert.Equal(t, prepare.BroadcastBuffers, model.BufferSync())
	require.ErrorContains(t, model.SyncBuffers(-1), "buffer sync")
	require.NoError(t, model.SyncBuffers(prepare.AverageBuffers), "before the model is built there is nothing to sync")
	assert.Empty(t, model.Buffers())
}
