package schedule_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

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
