package accel_test

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

func newSingle(t *testing.T, opts ...accel.Option) *accel.Accelerator {
	t.Helper()
	acc, err := accel.New(append([]accel.Option{accel.WithBackend("go")}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = acc.Close() })
	return acc
}

func loaderFor(t *testing.T, acc *accel.Accelerator, n, b int, opts ...prepare.LoaderOption) *prepare.DataLoader {
	t.Helper()
	x, y := testmodel.Data(n, 3)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	require.NoError(t, err)
	l, err := acc.PrepareDataLoader(src, append([]prepare.LoaderOption{prepare.BatchSize(b)}, opts...)...)
	require.NoError(t, err)
	return l
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  accel.Option
		want string
	}{
		{"K=0", accel.WithGradientAccumulationSteps(0), "at least 1"},
		{"K<0", accel.WithGradientAccumulationSteps(-2), "at least 1"},
		{"cap=0", accel.WithBucketCapMB(0), "bucket cap"},
		{"cap<0", accel.WithBucketCapMB(-1), "bucket cap"},
		{"cap=NaN", accel.WithBucketCapMB(math.NaN()), "bucket cap"},
		{"timeout<0", accel.WithCollectiveTimeout(-time.Second), "timeout"},
		{"checkpoint limit<0", accel.WithCheckpointLimit(-1), "checkpoint limit must be a number of checkpoints to keep"},
		{"unknown backend", accel.WithBackend("nosuchbackend"), "nosuchbackend"},
		{"unknown engine", accel.WithEngine("carrier-pigeon"), "carrier-pigeon"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := accel.New(tc.opt)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestDefaultComputeBackendIsPureGo(t *testing.T) {
	t.Setenv("GOMLX_BACKEND", "")
	acc, err := accel.New()
	require.NoError(t, err)
	defer acc.Close()
	assert.Contains(t, acc.Backend().Name(), "("+cpu.PureGo+")")
	assert.Equal(t, 1, acc.WorldSize())
	assert.True(t, acc.IsMainProcess())
	assert.Equal(t, "single", acc.Communicator().Name())
}

// TestSyncSchedule: with K=3 and 7 batches, Accumulate syncs on batches 3 and 6 and on the last one (end
// of the data loader); Step and ZeroGrad do nothing, and leave the weights alone, on the other batches.
// Sync-each-batch all-reduces all 7 micro-batches but steps on the same 3.
func TestSyncSchedule(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       []accel.Option
		wantSyncs  []bool
		wantReduce int64 // all-reduce rounds (Stats.Syncs)
	}{
		{"K=3", []accel.Option{accel.WithGradientAccumulationSteps(3)},
			[]bool{false, false, true, false, false, true, true}, 3},
		{"K=3 sync each batch", []accel.Option{accel.WithGradientAccumulationSteps(3), accel.WithSyncEachBatch()},
			[]bool{false, false, true, false, false, true, true}, 7},
		{"K=1", nil, []bool{true, true, true, true, true, true, true}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acc := newSingle(t, tc.opts...)
			model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.SGD))
			require.NoError(t, err)
			loader := loaderFor(t, acc, 14, 2)
			var syncs, stepped, zeroed []bool
			for batch, err := range loader.All() {
				require.NoError(t, err)
				require.NoError(t, acc.Accumulate(func() error {
					if _, err := acc.Backward(model, batch); err != nil {
						return err
					}
					syncs = append(syncs, acc.SyncGradients())
					before, err := replicas.VariablesDigest(model.Parameters())
					require.NoError(t, err)
					ok, err := opt.Step()
					require.NoError(t, err)
					after, err := replicas.VariablesDigest(model.Parameters())
					require.NoError(t, err)
					assert.Equal(t, ok, before != after, "weights change exactly when Step reports a step")
					stepped = append(stepped, ok)
					zeroed = append(zeroed, acc.SyncGradients())
					return opt.ZeroGrad()
				}))
			}
			assert.Equal(t, tc.wantSyncs, syncs)
			assert.Equal(t, tc.wantSyncs, stepped)
			assert.Equal(t, tc.wantSyncs, zeroed)
			wantSteps := 0
			for _, s := range tc.wantSyncs {
				wantSteps += boolInt(s)
			}
			assert.EqualValues(t, wantSteps, opt.Steps())
			stats := acc.Stats()
			assert.EqualValues(t, tc.wantReduce, stats.Syncs, "all-reduce rounds")
			assert.EqualValues(t, 7, stats.MicroBatches)
			assert.Zero(t, stats.Collectives.Calls(), "a single process does not call the engine")
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestShortFinalCycleIsAveraged: when the data loader ends after m < K micro-batches, the step uses the
// mean of those m, the same as one process on their concatenation.
// TestClosedAcceleratorRefusesWork: once the accelerator is closed, its prepared model and optimizer
// return an error naming the call, not results computed on a job that has ended.
func TestClosedAcceleratorRefusesWork(t *testing.T) {
	inputs, labels := testmodel.Data(8, 5)
	acc := newSingle(t, accel.WithGradientAccumulationSteps(2))
	res, err := testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: 4}.Train(acc)
	require.NoError(t, err)
	_, err = res.Model.Predict(inputs)
	require.NoError(t, err, "Predict works while the accelerator is open")
	require.NoError(t, acc.Close())

	_, err = res.Model.Predict(inputs)
	assert.ErrorIs(t, err, backends.ErrClosed)
	assert.ErrorContains(t, err, "Predict after the accelerator was closed")
	_, err = res.Optimizer.Step()
	assert.ErrorIs(t, err, backends.ErrClosed)
	assert.ErrorContains(t, err, "optimizer step after the accelerator was closed")
	_, err = res.Model.Backward(prepare.Batch{Inputs: []*tensors.Tensor{inputs}, Labels: []*tensors.Tensor{labels}}, 1)
	assert.ErrorIs(t, err, backends.ErrClosed)
	assert.ErrorContains(t, err, "Backward after the accelerator was closed")
}

// TestNegativeEpochIsRefused: SetEpoch(-1) makes the next iteration fail with the value, and a valid epoch
// set afterwards iterates again.
func TestNegativeEpochIsRefused(t *testing.T) {
	acc := newSingle(t)
	loader := loaderFor(t, acc, 8, 4)
	loader.SetEpoch(-1)
	var errs []error
	for _, err := range loader.All() {
		errs = append(errs, err)
	}
	require.Len(t, errs, 1)
	assert.ErrorContains(t, errs[0], "SetEpoch(-1): epochs count from 0")
	loader.SetEpoch(0)
	batches := 0
	for _, err := range loader.All() {
		require.NoError(t, err)
		batches++
	}
	assert.Equal(t, 2, batches)
}

func TestShortFinalCycleIsAveraged(t *testing.T) {
	const b, k = 2, 4
	inputs, labels := testmodel.Data(3*b, 5) // 3 micro-batches, K=4: one short cycle
	acc := newSingle(t, accel.WithGradientAccumulationSteps(k))
	res, err := testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: b}.Train(acc)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Steps)
	backend, err := cpu.New(cpu.Config{Backend: "go"})
	require.NoError(t, err)
	require.NoError(t, testmodel.ReferenceTrain(backend, res.Initial, testmodel.SGD,
		testmodel.ReferenceBatches(inputs, labels, 3*b, 1)))
	worst, name, err := testmodel.MaxRelativeError(res.Model.Parameters(), res.Initial)
	require.NoError(t, err)
	assert.LessOrEqual(t, worst, 1e-5, name)
}

// TestCollectiveCounters: on 2 ranks every optimizer step costs exactly one all-reduce per bucket, and
// NoSync costs nothing.
func TestCollectiveCounters(t *testing.T) {
	const k = 3
	runRanks(t, 2, []accel.Option{accel.WithGradientAccumulationSteps(k), accel.WithBucketCapMB(0.0001)},
		func(rank int, acc *accel.Accelerator) error {
			model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			require.NoError(t, err)
			opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.Adam))
			require.NoError(t, err)
			loader := loaderFor(t, acc, 2*2*k*4, 2)
			first, err := loader.PeekBatch()
			require.NoError(t, err)
			require.NoError(t, model.Materialize(first))
			buckets := len(model.Plan().Buckets)
			require.Greater(t, buckets, 1, "a tiny cap must split the model into several buckets")

			base := acc.Stats()
			for batch, err := range loader.All() {
				require.NoError(t, err)
				require.NoError(t, acc.Accumulate(func() error {
					before := acc.Stats().Collectives.Of(backends.OpAllReduce)
					if _, err := acc.Backward(model, batch); err != nil {
						return err
					}
					after := acc.Stats().Collectives.Of(backends.OpAllReduce)
					wantCalls := 0
					if acc.SyncGradients() {
						wantCalls = buckets
					}
					assert.EqualValues(t, wantCalls, after.Calls-before.Calls, "rank %d", rank)
					if _, err := opt.Step(); err != nil {
						return err
					}
					err := opt.ZeroGrad()
					return err
				}))
			}
			delta := acc.Stats().Collectives.Sub(base.Collectives)
			assert.EqualValues(t, opt.Steps()*int64(buckets), delta.Of(backends.OpAllReduce).Calls)
			assert.EqualValues(t, opt.Steps()*model.Plan().TotalBytes(), delta.Of(backends.OpAllReduce).Bytes)

			// NoSync: no collective of any kind.
			before := acc.Stats().Collectives
			batch, err := loader.PeekBatch()
			require.NoError(t, err)
			require.NoError(t, acc.NoSync(func() error {
				_, err := acc.Backward(model, batch)
				assert.False(t, acc.SyncGradients())
				return err
			}))
			assert.Zero(t, acc.Stats().Collectives.Sub(before).Calls(), "NoSync must not communicate")
			return nil
		})
}

// TestReplicasStayBitwiseIdentical: 100 optimizer steps on 2 ranks, weights compared after every step.
func TestReplicasStayBitwiseIdentical(t *testing.T) {
	const ranks, steps, b = 2, 100, 2
	inputs, labels := testmodel.Data(ranks*b*steps, 9)
	digests := make([][][32]byte, ranks)
	runRanks(t, ranks, []accel.Option{accel.WithReplicaCheck()}, func(rank int, acc *accel.Accelerator) error {
		var model *prepare.Model
		run := testmodel.Run{Kind: testmodel.Adam, Inputs: inputs, Labels: labels, BatchSize: b,
			AfterStep: func(int64) error {
				d, err := replicas.VariablesDigest(model.ReplicatedVariables())
				digests[rank] = append(digests[rank], d)
				return err
			}}
		// The model is created inside Train; capture it through the accelerator's first prepared model.
		res, err := trainCapturing(acc, run, &model)
		if err == nil && res.Steps != steps {
			t.Errorf("rank %d took %d steps, want %d", rank, res.Steps, steps)
		}
		return err
	})
	require.Len(t, digests[0], steps)
	assert.Equal(t, digests[0], digests[1])
	assert.NotEqual(t, digests[0][0], digests[0][steps-1], "weights must change during training")
}

// trainCapturing runs run.Train, exposing the model to run.AfterStep through *model.
func trainCapturing(acc *accel.Accelerator, run testmodel.Run, model **prepare.Model) (testmodel.Result, error) {
	inner := run.AfterStep
	run.AfterStep = func(step int64) error {
		if *model == nil {
			*model = acc.Models()[0]
		}
		return inner(step)
	}
	return run.Train(acc)
}

// TestModelMismatchAcrossRanks: ranks that build different models all fail at preparation with a message
// that names the differing variable, instead of hanging or summing unrelated numbers.
func TestModelMismatchAcrossRanks(t *testing.T) {
	comms, err := backends.NewInProcessGroup(2, backends.WithTimeout(20*time.Second))
	require.NoError(t, err)
	errs := make([]error, 2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg = make(chan int, 2)
		for r := range 2 {
			go func() {
				defer func() { wg <- r }()
				acc, err := accel.New(accel.WithCommunicator(comms[r]), accel.WithBackend("go"))
				if err != nil {
					errs[r] = err
					return
				}
				hidden := testmodel.Hidden + r // rank 1 builds a wider hidden layer
				modelFn := func(ctx *context.Context, in []*Node) []*Node {
					h := Tanh(layers.Dense(ctx.In("hidden"), in[0], true, hidden))
					return []*Node{layers.Dense(ctx.In("output"), h, true, testmodel.Classes)}
				}
				model, err := acc.PrepareModel(context.New(), modelFn, testmodel.Loss)
				if err != nil {
					errs[r] = err
					return
				}
				x, y := testmodel.Data(4, 1)
				_, errs[r] = acc.Backward(model, prepare.Batch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}})
			}()
		}
		<-wg
		<-wg
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("ranks with mismatched models hung")
	}
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.Contains(t, err.Error(), "/hidden/dense/weights", "rank %d", r)
		assert.Contains(t, err.Error(), "differ across ranks", "rank %d", r)
	}
}

// TestUnevenDatasetGatherForMetrics: dataset sizes not divisible by N (nor by N·b) finish on every rank,
// and GatherForMetrics sees every example exactly once.
func TestUnevenDatasetGatherForMetrics(t *testing.T) {
	for _, tc := range []struct{ n, ranks, b int }{{13, 4, 2}, {10, 3, 4}, {7, 2, 3}, {5, 4, 1}} {
		seen := make([][]int32, tc.ranks)
		runRanks(t, tc.ranks, nil, func(rank int, acc *accel.Accelerator) error {
			x, y := testmodel.Data(tc.n, 1)
			src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
			require.NoError(t, err)
			loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(tc.b), prepare.Shuffle())
			require.NoError(t, err)
			for batch, err := range loader.All() {
				require.NoError(t, err)
				ids := make([]int32, len(batch.Indices))
				for i, idx := range batch.Indices {
					ids[i] = int32(idx)
				}
				all, err := acc.GatherForMetrics(tensors.FromFlatDataAndDimensions(ids, len(ids)), batch)
				if err != nil {
					return err
				}
				seen[rank] = append(seen[rank], tensors.MustCopyFlatData[int32](all)...)
			}
			return nil
		})
		for r := range tc.ranks {
			got := slices.Clone(seen[r])
			slices.Sort(got)
			want := make([]int32, tc.n)
			for i := range want {
				want[i] = int32(i)
			}
			assert.Equal(t, want, got, "n=%d ranks=%d b=%d rank %d", tc.n, tc.ranks, tc.b, r)
		}
	}
}

// TestOutOfRangeLabelsAreRefused: a class label outside the model's outputs stops training with the value
// and the example that holds it, instead of training silently with a loss of 0 for it.
func TestOutOfRangeLabelsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		at    int
		label int32
	}{
		{"label 99 of 3 classes", 5, 99},
		{"label -1", 2, -1},
		{"label 3, one past the last class", 7, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inputs, labels := testmodel.Data(8, 5)
			flat := tensors.MustCopyFlatData[int32](labels)
			flat[tc.at] = tc.label
			labels = tensors.FromFlatDataAndDimensions(flat, 8, 1)
			acc := newSingle(t)
			_, err := testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: 4}.Train(acc)
			require.Error(t, err)
			assert.ErrorContains(t, err, fmt.Sprintf("is %d, not a class of the model's 3 outputs [0, 3)", tc.label))
			assert.ErrorContains(t, err, fmt.Sprintf("(source example %d)", tc.at))
		})
	}
}
