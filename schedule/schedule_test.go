package schedule_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/goaccel/goaccel/prepare"
	"github.com/goaccel/goaccel/schedule"
)

// TestCurves compares each schedule with rates worked out by hand: peak 0.1, 2 warm-up steps, 6 steps in
// all (warm-up 0, 0.05; then the decay over steps 2..6).
func TestCurves(t *testing.T) {
	tests := []struct {
		name  string
		sized schedule.Sized
		want  []float64 // steps 0..6 (step 6 is past the end: the final rate stays)
	}{
		{"cosine", schedule.Cosine(0.1, 2), []float64{0, 0.05, 0.1, 0.0853553391, 0.05, 0.0146446609, 0}},
		{"linear", schedule.Linear(0.1, 2), []float64{0, 0.05, 0.1, 0.075, 0.05, 0.025, 0}},
		{"cosine to a minimum", schedule.Cosine(0.1, 2, schedule.MinRate(0.01)),
			[]float64{0, 0.05, 0.1, 0.0868198052, 0.055, 0.0231801948, 0.01}},
		{"linear without warm-up", schedule.Linear(0.1, 0), []float64{0.1, 0.0833333333, 0.0666666667, 0.05, 0.0333333333, 0.0166666667, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rate := tc.sized(6)
			for step, want := range tc.want {
				assert.InDelta(t, want, rate(int64(step)), 1e-9, "step %d", step)
			}
		})
	}
}

// TestShortJob: a job no longer than its warm-up decays at once to the final rate after it.
func TestShortJob(t *testing.T) {
	rate := schedule.Cosine(0.1, 4)(3)
	assert.InDelta(t, 0.025, rate(1), 1e-12)
	assert.InDelta(t, 0.0, rate(4), 1e-12)
}

// TestInExamples: sized in examples, a schedule gives the rate of the share of the job seen. On a job of
// whole steps (6 steps of 4 examples) it gives each step's boundary the rate sized in steps gives the step,
// warm-up in steps included (2 steps = 8 examples); between boundaries it follows the same curve, so a run
// with another global batch finds the rate of its share of the job: at 60% of a cosine, whatever the
// examples per step, the same rate.
func TestInExamples(t *testing.T) {
	for _, sized := range []schedule.Sized{schedule.Cosine(0.1, 2), schedule.Linear(0.1, 2, schedule.MinRate(0.01))} {
		steps, examples := sized(6), sized(24, schedule.InExamples(4))
		for step := range int64(7) {
			assert.InDelta(t, steps(step), examples(4*step), 1e-12, "step %d", step)
		}
	}
	// Warm-up as a share of the job: the same curve whatever the examples per step.
	want := 0.1 * 0.5 * (1 + math.Cos(math.Pi*(0.6-0.25)/0.75))
	for _, perStep := range []int64{1, 4, 8, 16, 48} {
		rate := schedule.Cosine(0.1, 99, schedule.WarmupRatio(0.25))(160, schedule.InExamples(perStep))
		assert.InDelta(t, want, rate(96), 1e-12, "%d examples per step", perStep)
		assert.InDelta(t, 0.05, rate(20), 1e-12, "half-way through the warm-up, %d examples per step", perStep)
	}
}

// TestWarmupRatio: a warm-up given as a share of the job, sized in steps: 2 of 8 steps.
func TestWarmupRatio(t *testing.T) {
	rate := schedule.Linear(0.1, 5, schedule.WarmupRatio(0.25))(8)
	for step, want := range []float64{0, 0.05, 0.1, 0.0833333333, 0.0666666667, 0.05, 0.0333333333, 0.0166666667, 0} {
		assert.InDelta(t, want, rate(int64(step)), 1e-9, "step %d", step)
	}
	assert.InDelta(t, 0.1, schedule.Linear(0.1, 5, schedule.WarmupRatio(-1))(8)(0), 1e-12, "no warm-up")
}

// TestFromSteps: a schedule that only knows steps, sized in examples, is sized with the job's steps and
// given the step of the examples seen.
func TestFromSteps(t *testing.T) {
	var total int64
	sized := schedule.FromSteps(func(steps int64) prepare.Schedule {
		total = steps
		return func(step int64) float64 { return float64(step) }
	})
	assert.Equal(t, 3.0, sized(10)(3))
	assert.Equal(t, int64(10), total)
	rate := sized(22, schedule.InExamples(4))
	assert.Equal(t, int64(6), total, "22 examples in steps of 4: 6 steps")
	assert.Equal(t, 2.0, rate(11))
}
