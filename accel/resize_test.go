package accel_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// shape is one run's N processes × K micro-batches × b examples.
type shape struct{ ranks, k, b int }

func (s shape) global() int { return s.ranks * s.k * s.b }

func (s shape) String() string { return fmt.Sprintf("%d×%d×%d", s.ranks, s.k, s.b) }

// trainCurve runs the loop from the loader's epoch to epochs, stopping after stopAfterSteps optimizer
// steps of this run (if > 0), and returns its loss curve: the mean loss of every optimizer step over every
// process's micro-batches (one all-reduce per step).
func (r resumable) trainCurve(acc *accel.Accelerator, epochs int, stopAfterSteps int64) ([]float64, error) {
	var curve []float64
	var sum, count float64
	startSteps := r.opt.Steps()
	err := r.loop(acc, epochs, func(loss float64, stepped bool) (bool, error) {
		sum, count = sum+loss, count+1
		if !stepped {
			return false, nil
		}
		total, err := acc.Reduce(tensors.FromValue([]float64{sum, count}), accel.Sum)
		if err != nil {
			return true, err
		}
		both := tensors.MustCopyFlatData[float64](total)
		curve = append(curve, both[0]/both[1])
		sum, count = 0, 0
		return stopAfterSteps > 0 && r.opt.Steps()-startSteps == stopAfterSteps, nil
	})
	return curve, err
}

// resizeOutcome is what rank 0 of a run reports: its final weights and the loss curve.
type resizeOutcome struct {
	final *context.Context
	curve []float64
}

// runShape runs fn on the ranks of s with s's K, and returns rank 0's final weights and curve.
func runShape(t *testing.T, s shape, out *bytes.Buffer, fn func(acc *accel.Accelerator, r resumable) ([]float64, error)) resizeOutcome {
	t.Helper()
	var res resizeOutcome
	var mu sync.Mutex
	opts := []accel.Option{accel.WithGradientAccumulationSteps(s.k), accel.WithSeed(11)}
	if out != nil {
		opts = append(opts, accel.WithOutput(out))
	}
	runRanks(t, s.ranks, opts, func(rank int, acc *accel.Accelerator) error {
		r := prepareResumableWith(t, acc, testmodel.SGD, resizeExamples, s.b, 1)
		curve, err := fn(acc, r)
		if err != nil || rank != 0 {
			return err
		}
		snap, err := testmodel.TakeSnapshot(r.model.Parameters())
		mu.Lock()
		res = resizeOutcome{final: snap.Context(), curve: curve}
		mu.Unlock()
		return err
	})
	return res
}

// resizeExamples makes 6 optimizer steps of 8 examples per epoch.
const resizeExamples = 48

// TestResumeOnAnotherWorldSize: a checkpoint saved at an optimizer-step boundary by N processes resumes on
// N' processes with N'·K'·b' = N·K·b, and the rest of the run takes the same optimizer steps over the same
// examples as a run that never stopped: final weights within 1e-5 (relative) on SGD and the same loss
// curve within 1e-4, for 1→2, 2→4, 4→2 and 2→1 (K and b change too). The checkpoint is mid-epoch, and the
// resumed run crosses into the next epoch.
func TestResumeOnAnotherWorldSize(t *testing.T) {
	const epochs, stopAfter = 2, 4
	for _, tc := range []struct{ from, to shape }{
		{shape{1, 2, 4}, shape{2, 2, 2}},
		{shape{2, 2, 2}, shape{4, 1, 2}},
		{shape{4, 1, 2}, shape{2, 2, 2}},
		{shape{2, 2, 2}, shape{1, 4, 2}},
	} {
		t.Run(fmt.Sprintf("%d to %d processes (%v to %v)", tc.from.ranks, tc.to.ranks, tc.from, tc.to), func(t *testing.T) {
			require.Equal(t, tc.from.global(), tc.to.global())
			dir := t.TempDir()
			straight := runShape(t, tc.from, nil, func(acc *accel.Accelerator, r resumable) ([]float64, error) {
				return r.trainCurve(acc, epochs, 0)
			})
			require.Len(t, straight.curve, epochs*resizeExamples/tc.from.global())
			var atSave *context.Context
			first := runShape(t, tc.from, nil, func(acc *accel.Accelerator, r resumable) ([]float64, error) {
				curve, err := r.trainCurve(acc, epochs, stopAfter)
				if err != nil {
					return curve, err
				}
				snap, err := testmodel.TakeSnapshot(r.model.Parameters())
				if acc.IsMainProcess() { // every rank holds the same parameters
					atSave = snap.Context()
				}
				if err != nil {
					return curve, err
				}
				_, err = acc.SaveState(dir)
				return curve, err
			})
			var out bytes.Buffer
			resumed := runShape(t, tc.to, &out, func(acc *accel.Accelerator, r resumable) ([]float64, error) {
				if err := acc.LoadState(dir); err != nil {
					return nil, err
				}
				if got := r.loader.State(); got != (prepare.LoaderState{Epoch: 0, Consumed: stopAfter * tc.from.global()}) {
					return nil, fmt.Errorf("restored place %+v", got)
				}
				return r.trainCurve(acc, epochs, 0)
			})
			assert.NotContains(t, out.String(), "global batch", "the global batch did not change")

			// Control: the weights moved after the checkpoint, so the comparison below is not vacuous.
			moved, _, err := testmodel.MaxRelativeError(allVariables(resumed.final), atSave)
			require.NoError(t, err)
			require.Greater(t, moved, 1e-3)

			worst, name, err := testmodel.MaxRelativeError(allVariables(resumed.final), straight.final)
			require.NoError(t, err)
			assert.LessOrEqual(t, worst, 1e-5, "variable %s", name)
			curve := append(first.curve, resumed.curve...)
			require.Len(t, curve, len(straight.curve))
			for i := range curve {
				assert.InDelta(t, straight.curve[i], curve[i], 1e-4, "optimizer step %d's loss", i+1)
			}
		})
	}
}

// TestResumeWithAnotherGlobalBatch: a step-boundary checkpoint resumed with another N·K·b resumes, says so
// in one line with both global batches, does not rescale the learning rate, and consumes the rest of the
// epoch, each example once.
func TestResumeWithAnotherGlobalBatch(t *testing.T) {
	dir := t.TempDir()
	from, to := shape{2, 2, 2}, shape{4, 2, 2}
	runShape(t, from, nil, func(acc *accel.Accelerator, r resumable) ([]float64, error) {
		curve, err := r.trainCurve(acc, 1, 2) // 16 of the epoch's 48 examples
		if err == nil {
			_, err = acc.SaveState(dir)
		}
		return curve, err
	})
	var out bytes.Buffer
	var seen [][]int
	var mu sync.Mutex
	resumed := runShape(t, to, &out, func(acc *accel.Accelerator, r resumable) ([]float64, error) {
		if err := acc.LoadState(dir); err != nil {
			return nil, err
		}
		lr := learningRate(t, r.model)
		for batch, err := range r.loader.All() {
			if err != nil {
				return nil, err
			}
			mu.Lock()
			seen = append(seen, batch.Indices[:batch.Valid])
			mu.Unlock()
			err = acc.Accumulate(func() error {
				if _, err := acc.Backward(r.model, batch); err != nil {
					return err
				}
				if _, err := r.opt.Step(); err != nil {
					return err
				}
				return r.opt.ZeroGrad()
			})
			if err != nil {
				return nil, err
			}
		}
		if after := learningRate(t, r.model); after != lr {
			return nil, fmt.Errorf("learning rate changed from %g to %g", lr, after)
		}
		return []float64{float64(r.opt.Steps())}, nil
	})
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 1, "one line:\n%s", out.String())
	assert.Equal(t, "accel: the global batch changed: the checkpoint's run took 8 examples per optimizer step "+
		"(2 processes × K=2 × batch 2), this one takes 16 (4 processes × K=2 × batch 2); the learning rate is not "+
		"rescaled", lines[0])
	var all []int
	for _, ids := range seen {
		all = append(all, ids...)
	}
	assert.Len(t, all, 48-16, "the rest of the epoch")
	assert.ElementsMatch(t, uniq(all), all, "each example once")
	assert.Equal(t, []float64{2 + 2}, resumed.curve, "2 steps saved, then 32 examples in steps of 16")
}

func uniq(xs []int) []int {
	seen := map[int]bool{}
	var out []int
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// learningRate reads the SGD learning rate the model's context holds (GoMLX keeps it as a variable).
func learningRate(t testing.TB, m *prepare.Model) float64 {
	t.Helper()
	for v := range m.Context().IterVariables() {
		if strings.Contains(v.ScopeAndName(), "learning_rate") {
			values, err := testmodel.FlatFloat64(v)
			require.NoError(t, err)
			return values[0]
		}
	}
	t.Fatal("no learning-rate variable")
	return 0
}

// TestInsideCycleCheckpointOnAnotherWorldSize: a checkpoint saved inside an accumulation cycle is refused on
// another world size (every rank, the same error, saying to save at an optimizer-step boundary) and
// nothing changes; on the same world size it resumes (TestResumeIsBitwiseExact).
func TestInsideCycleCheckpointOnAnotherWorldSize(t *testing.T) {
	dir := t.TempDir()
	runRanks(t, 2, []accel.Option{accel.WithGradientAccumulationSteps(3), accel.WithSeed(11)}, func(rank int, acc *accel.Accelerator) error {
		r := prepareResumable(t, acc, 40, 2, 1)
		if _, err := r.train(acc, 1, 4); err != nil { // one micro-batch into the second cycle
			return err
		}
		_, err := acc.SaveState(dir)
		return err
	})
	for _, tc := range []struct {
		ranks, k, b int
		want        string
	}{
		{4, 3, 2, "saved by 2 processes and this run has 4"},
		{1, 3, 2, "saved by 2 processes and this run has 1"},
		{2, 2, 2, "saved with 3 accumulation steps and this run uses 2"},
		{2, 3, 4, "was saved with batch size 2 per process, this run uses 4"},
	} {
		t.Run(fmt.Sprintf("%d×%d×%d", tc.ranks, tc.k, tc.b), func(t *testing.T) {
			errs := make([]error, tc.ranks)
			runRanks(t, tc.ranks, []accel.Option{accel.WithGradientAccumulationSteps(tc.k), accel.WithSeed(11)},
				func(rank int, acc *accel.Accelerator) error {
					errs[rank] = loadChangesNothingOnRefusal(t, acc, prepareResumable(t, acc, 40, tc.b, 1), dir)
					return nil
				})
			for rank, err := range errs {
				require.Error(t, err, "rank %d", rank)
				assert.ErrorIs(t, err, accumulate.ErrInsideCycle)
				assert.Contains(t, err.Error(), tc.want)
				assert.Contains(t, err.Error(), "save at an optimizer-step boundary")
				assert.Equal(t, errs[0].Error(), err.Error(), "every rank gets the same error")
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestEpochEndSaveResumesAtNextEpoch: SaveState right after an epoch's last batch, with no SetEpoch before
// it, resumes at the start of the next epoch: no empty epoch is replayed, and the weights equal a run
// that never stopped, bitwise.
func TestEpochEndSaveResumesAtNextEpoch(t *testing.T) {
	for _, ranks := range []int{1, 2} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			const k, b, perEpoch = 3, 2, 7
			n := ranks * b * perEpoch
			opts := []accel.Option{accel.WithGradientAccumulationSteps(k), accel.WithSeed(5)}
			dir := t.TempDir()
			straight := make([][32]byte, ranks)
			resumed := make([][32]byte, ranks)
			runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
				r := prepareResumable(t, acc, n, b, 1)
				if _, err := r.train(acc, 2, 0); err != nil {
					return err
				}
				var err error
				straight[rank], err = replicas.VariablesDigest(r.model.ReplicatedVariables())
				return err
			})
			runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
				r := prepareResumable(t, acc, n, b, 1)
				if _, err := r.train(acc, 1, 0); err != nil { // epoch 0 whole, no SetEpoch(1) after it
					return err
				}
				_, err := acc.SaveState(dir)
				return err
			})
			runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
				r := prepareResumable(t, acc, n, b, 1)
				if err := acc.LoadState(dir); err != nil {
					return err
				}
				if r.loader.Epoch() != 1 || r.loader.Position() != 0 {
					return fmt.Errorf("resumed at epoch %d, batch %d; want epoch 1, batch 0", r.loader.Epoch(), r.loader.Position())
				}
				ran, err := r.train(acc, 2, 0)
				if err != nil {
					return err
				}
				if ran != perEpoch {
					return fmt.Errorf("the resumed run ran %d micro-batches, want one epoch's %d", ran, perEpoch)
				}
				resumed[rank], err = replicas.VariablesDigest(r.model.ReplicatedVariables())
				return err
			})
			assert.Equal(t, straight, resumed)
		})
	}
}

// TestFormat1CheckpointsLoad: checkpoints of state format 1 (per-process batch positions), written by the
// previous version into testdata/format1 on 2 processes (K=3, batch 2, 11 batches per epoch, Adam), load
// on 2 processes — inside a cycle (epoch 1, batch 5) and at the end of epoch 0, which now resumes at
// epoch 1 — and train on to the weights of a run that never stopped; on 1 process they are refused.
func TestFormat1CheckpointsLoad(t *testing.T) {
	const k, b, ranks, epochs = 3, 2, 2, 2
	n := ranks * b * 11
	opts := []accel.Option{accel.WithGradientAccumulationSteps(k), accel.WithSeed(7)}
	straight := make([]*context.Context, ranks)
	runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
		r := prepareResumable(t, acc, n, b, 1)
		if _, err := r.train(acc, epochs, 0); err != nil {
			return err
		}
		snap, err := testmodel.TakeSnapshot(r.model.Parameters())
		straight[rank] = snap.Context()
		return err
	})
	for _, tc := range []struct {
		dir             string
		epoch, position int
		steps           int64
	}{
		{"testdata/format1/mid-cycle", 1, 5, 5},
		{"testdata/format1/epoch-end", 1, 0, 4},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
				r := prepareResumable(t, acc, n, b, 1)
				if err := acc.LoadState(tc.dir); err != nil {
					return err
				}
				if r.loader.Epoch() != tc.epoch || r.loader.Position() != tc.position || r.opt.Steps() != tc.steps {
					return fmt.Errorf("restored epoch %d, batch %d, %d steps; want %d, %d, %d", r.loader.Epoch(),
						r.loader.Position(), r.opt.Steps(), tc.epoch, tc.position, tc.steps)
				}
				if _, err := r.train(acc, epochs, 0); err != nil {
					return err
				}
				worst, name, err := testmodel.MaxRelativeError(r.model.Parameters(), straight[rank])
				if err == nil && !(worst <= 1e-6) {
					err = fmt.Errorf("rank %d: variable %s differs from the straight run by %g", rank, name, worst)
				}
				return err
			})
			acc := newSingle(t, opts...)
			r := prepareResumable(t, acc, n, b, 1)
			err := acc.LoadState(tc.dir)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "state format 1")
			assert.Contains(t, err.Error(), "resume it with 2 processes")
			assert.Zero(t, r.opt.Steps())
		})
	}
}
