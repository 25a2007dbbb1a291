package accel_test

import (
	"io"
	"math"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
	"github.com/goaccel/goaccel/schedule"
)

// The job of the schedule tests: 2 epochs of 80 examples, a cosine from 0.1 to 0.01 after a warm-up over
// the first quarter of the job (40 examples).
const (
	jobEpochs   = 2
	jobExamples = 80
	jobPeak     = 0.1
	jobMin      = 0.01
	jobWarmup   = 0.25
)

// jobRate is the rate worked out by hand at a share done of the job.
func jobRate(done float64) float64 {
	if done < jobWarmup {
		return jobPeak * done / jobWarmup
	}
	return jobMin + (jobPeak-jobMin)*0.5*(1+math.Cos(math.Pi*(done-jobWarmup)/(1-jobWarmup)))
}

// appliedRate is one optimizer step: the examples the job had seen before it (as the loader's place says
// after the step before) and the learning rate the step applied (the optimizer's variable).
type appliedRate struct {
	seen int64
	rate float64
}

// scheduledRun is rank 0's record of one run of the job.
type scheduledRun struct {
	rates []appliedRate
	// saved is the loader's place, in examples of the job, at the checkpoint it loaded or saved; next is
	// where the step after the run's last one begins (its last step boundary).
	saved, next int64
}

// runScheduledJob runs the job on s's ranks with the schedule sized by Prepare, stopping (and saving into
// dir) after stopAfter micro-batches of this run when it is > 0. from, when not nil, is the run whose
// checkpoint in dir this one resumes: its first step begins where from's next one would have.
func runScheduledJob(t *testing.T, s shape, sized schedule.Sized, dir string, from *scheduledRun, stopAfter int) scheduledRun {
	t.Helper()
	return runScheduledJobOn(t, s, jobExamples, nil, sized, dir, from, stopAfter)
}

// runScheduledJobOn is runScheduledJob on a dataset of n examples, with more loader options.
func runScheduledJobOn(t *testing.T, s shape, n int, loaderOpts []prepare.LoaderOption, sized schedule.Sized, dir string,
	from *scheduledRun, stopAfter int) scheduledRun {
	t.Helper()
	var res scheduledRun
	var mu sync.Mutex
	opts := []accel.Option{accel.WithGradientAccumulationSteps(s.k), accel.WithSeed(11), accel.WithOutput(io.Discard)}
	runRanks(t, s.ranks, opts, func(rank int, acc *accel.Accelerator) error {
		x, y := testmodel.Data(n, 3)
		src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
		if err != nil {
			return err
		}
		p, err := acc.Prepare(accel.Spec{Model: testmodel.MLP, Loss: testmodel.Loss,
			Optimizer: testmodel.NewOptimizer(testmodel.SGD), SizedSchedule: sized, Epochs: jobEpochs,
			Loaders: []accel.LoaderSpec{{Source: src, Options: append([]prepare.LoaderOption{prepare.BatchSize(s.b), prepare.Shuffle()}, loaderOpts...)}}})
		if err != nil {
			return err
		}
		loader := p.Loaders[0]
		seen := func() int64 {
			state := loader.State()
			return int64(state.Epoch*n + state.Consumed)
		}
		var run scheduledRun
		before, ran := int64(0), 0
		if from != nil {
			if err := acc.LoadState(dir); err != nil {
				return err
			}
			run.saved, before = seen(), from.next
		}
		// The scheduler is not asked before the loop: the first step after a resume finds where it began
		// from inside its own accumulation cycle.
	loop:
		for epoch := loader.Epoch(); epoch < jobEpochs; epoch++ {
			loader.SetEpoch(epoch)
			for batch, err := range loader.All() {
				if err != nil {
					return err
				}
				var stepped bool
				err = acc.Accumulate(func() error {
					if _, err := acc.Backward(p.Model, batch); err != nil {
						return err
					}
					var err error
					if stepped, err = p.Optimizer.Step(); err != nil {
						return err
					}
					return p.Optimizer.ZeroGrad()
				})
				if err != nil {
					return err
				}
				if stepped {
					run.rates = append(run.rates, appliedRate{before, learningRate(t, p.Model)})
					before = seen()
				}
				if ran++; ran == stopAfter {
					if _, err := acc.SaveState(dir); err != nil {
						return err
					}
					run.saved = seen()
					break loop
				}
			}
		}
		run.next = before
		if rank == 0 {
			mu.Lock()
			res = run
			mu.Unlock()
		}
		return nil
	})
	return res
}

// rateAt is the rate of the run's step that began with seen examples of the job behind it.
func (r scheduledRun) rateAt(seen int64) (float64, bool) {
	for _, a := range r.rates {
		if a.seen == seen {
			return a.rate, true
		}
	}
	return 0, false
}

// TestScheduleFollowsTheJobAcrossResizes: a schedule sized by the job (Spec.SizedSchedule, a cosine with
// its warm-up a quarter of the job) gives each optimizer step the rate of the share of the job done before
// it, so a run resumed with another global batch — on 1→2, 2→4 and 4→2 processes, inside the warm-up, after
// it, and with a first resumed step that ends the epoch on a short batch — carries on from where the
// checkpoint's data position says, instead of counting its own steps against a total sized for another
// global batch. At 60% of the job every run, whatever its process count, applies the same rate. A run
// resumed from inside an accumulation cycle on the same shape applies the rates of a run that never
// stopped.
func TestScheduleFollowsTheJobAcrossResizes(t *testing.T) {
	sized := schedule.Cosine(jobPeak, 1000, schedule.WarmupRatio(jobWarmup), schedule.MinRate(jobMin))
	const job = jobEpochs * jobExamples
	const atSixty = job * 6 / 10 // 96: a step boundary for 4, 8 and 16 examples per step
	checkRates := func(t *testing.T, name string, run scheduledRun) {
		t.Helper()
		require.NotEmpty(t, run.rates, name)
		for i, a := range run.rates {
			assert.InDelta(t, jobRate(float64(a.seen)/job), a.rate, 1e-7, "%s: step %d, after %d examples", name, i, a.seen)
		}
	}
	for _, tc := range []struct {
		name      string
		from, to  shape
		stopAfter int // micro-batches of the first run
	}{
		{"1 to 2 processes inside the warm-up", shape{1, 2, 2}, shape{2, 2, 2}, 6},         // 12 examples
		{"2 to 4 processes, first step ends the epoch", shape{2, 1, 4}, shape{4, 1, 4}, 9}, // 72
		{"4 to 2 processes after the warm-up", shape{4, 2, 2}, shape{2, 1, 4}, 8},          // 64
		{"1 process, inside an accumulation cycle", shape{1, 2, 2}, shape{1, 2, 2}, 17},    // 34, mid-cycle
		{"2 to 4 processes in the second epoch", shape{2, 2, 2}, shape{4, 2, 2}, 24},       // 96
		{"4 to 1 process in the second epoch", shape{4, 1, 2}, shape{1, 1, 4}, 12},         // 96
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			straight := runScheduledJob(t, tc.from, sized, "", nil, 0)
			first := runScheduledJob(t, tc.from, sized, dir, nil, tc.stopAfter)
			resumed := runScheduledJob(t, tc.to, sized, dir, &first, 0)
			checkRates(t, "uninterrupted "+tc.from.String(), straight)
			checkRates(t, "first "+tc.from.String(), first)
			checkRates(t, "resumed "+tc.to.String(), resumed)
			require.Equal(t, first.saved, resumed.saved)
			assert.Equal(t, int64(job), resumed.next, "the resumed run ends the job")
			if tc.from == tc.to {
				assert.Equal(t, straight.rates, append(first.rates, resumed.rates...), "a run that never stopped")
			}
			for _, run := range []scheduledRun{straight, resumed} {
				rate, ok := run.rateAt(atSixty)
				require.True(t, ok, "a step begins at 60%% of the job")
				assert.InDelta(t, jobRate(0.6), rate, 1e-7, "60%% of the job")
			}
		})
	}
}

// TestScheduleWarmupInStepsAfterAResize: a warm-up given in optimizer steps covers the steps of the run that
// takes them — the run's global batch × the steps — so a run resumed with twice the global batch finds the
// curve of a warm-up twice as long a share of the job (the reason to give the warm-up as a share of the job,
// schedule.WarmupRatio, in jobs that may change their number of processes); the decay still follows the
// share of the job done.
func TestScheduleWarmupInStepsAfterAResize(t *testing.T) {
	const job = jobEpochs * jobExamples
	sized := schedule.Linear(jobPeak, 4) // 4 steps: 16 examples of 1×1×4, 32 of 2×1×4
	dir := t.TempDir()
	first := runScheduledJob(t, shape{1, 1, 4}, sized, dir, nil, 10) // 40 examples
	resumed := runScheduledJob(t, shape{2, 1, 4}, sized, dir, &first, 0)
	for _, a := range resumed.rates {
		want := jobPeak * (1 - (float64(a.seen)-32)/(job-32))
		assert.InDelta(t, want, a.rate, 1e-7, "after %d examples", a.seen)
	}
	assert.Equal(t, int64(40), resumed.rates[0].seen)
}

// TestScheduleResumesIntoADroppedTail: with drop-last, a run resumed where its first step ends the epoch
// (84 examples in steps of 8: the step from 72 takes 8 and drops the last 4) applies the rates of a run
// that never stopped.
func TestScheduleResumesIntoADroppedTail(t *testing.T) {
	sized := schedule.Cosine(jobPeak, 3, schedule.MinRate(jobMin))
	drop := []prepare.LoaderOption{prepare.DropLast()}
	s, dir := shape{2, 1, 4}, t.TempDir()
	straight := runScheduledJobOn(t, s, 84, drop, sized, "", nil, 0)
	first := runScheduledJobOn(t, s, 84, drop, sized, dir, nil, 9) // 72 examples
	resumed := runScheduledJobOn(t, s, 84, drop, sized, dir, &first, 0)
	require.Equal(t, int64(72), first.next)
	assert.Equal(t, straight.rates, append(first.rates, resumed.rates...))
}

// TestScheduleNeedsItsLoader: a schedule sized by the job follows the first loader of the Spec; a loop
// that trains from another loader is told so at its first optimizer step, instead of keeping the rate of
// the job's start for good.
func TestScheduleNeedsItsLoader(t *testing.T) {
	acc := newSingle(t, accel.WithOutput(io.Discard))
	x, y := testmodel.Data(16, 3)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	require.NoError(t, err)
	p, err := acc.Prepare(accel.Spec{Model: testmodel.MLP, Loss: testmodel.Loss,
		Optimizer: testmodel.NewOptimizer(testmodel.SGD), SizedSchedule: schedule.Linear(0.1, 0), Epochs: 1,
		Loaders: []accel.LoaderSpec{{Source: src}, {Source: src, Options: []prepare.LoaderOption{prepare.BatchSize(4)}}}})
	require.NoError(t, err)
	for batch, err := range p.Loaders[1].All() {
		require.NoError(t, err)
		_, err = acc.Backward(p.Model, batch)
		require.NoError(t, err)
		_, err = p.Optimizer.Step()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "optimizer step 1 drew none from it")
		break
	}
}
