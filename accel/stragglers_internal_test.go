package accel

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestStragglerRule: the rule on the ranks' window medians (seconds): the slowest rank, when at least 20%
// and 1 ms above the median of the medians.
func TestStragglerRule(t *testing.T) {
	tests := []struct {
		name     string
		medians  []float64
		want     int
		wantRate float64
	}{
		{"two even ranks", []float64{0.010, 0.0105}, -1, 0},
		{"two ranks, one 2x slower", []float64{0.010, 0.020}, 1, 0.020 / 0.015},
		{"four ranks, one 30% slower", []float64{0.010, 0.010, 0.013, 0.010}, 2, 1.3},
		{"four ranks, one 15% slower", []float64{0.010, 0.010, 0.0115, 0.010}, -1, 0},
		{"20% but under a millisecond", []float64{0.001, 0.001, 0.0015}, -1, 0},
		{"two slow ranks: the slowest is named", []float64{0.010, 0.030, 0.010, 0.020, 0.010}, 1, 3},
		{"nothing timed", []float64{0, 0}, -1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rank, ratio, _ := straggler(tt.medians)
			assert.Equal(t, tt.want, rank)
			assert.InDelta(t, tt.wantRate, ratio, 1e-9)
		})
	}
}

// TestStepWindow: the window keeps the last stragglerWindow step times, and the run's sample halves and
// keeps every other step once full.
func TestStepWindow(t *testing.T) {
	s := newStragglers(nil)
	for i := range 30 {
		s.steps = int64(i + 1)
		s.record(time.Duration(i+1) * time.Millisecond)
	}
	assert.Len(t, s.window, stragglerWindow)
	assert.Equal(t, 11*time.Millisecond, s.window[0])
	assert.Equal(t, 30*time.Millisecond, s.window[stragglerWindow-1])
	assert.Equal(t, 20*time.Millisecond, quantile(s.window, 0.5))
	assert.Equal(t, 29*time.Millisecond, quantile(s.window, 0.95))
	assert.Len(t, s.times, 30)
}
