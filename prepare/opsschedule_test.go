package prepare

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestOpsTuner: after the warm-up the micro-batches alternate between the schedules, and once each has been
// measured tunePerMode times the faster by median stays, the backend's own on a near tie.
func TestOpsTuner(t *testing.T) {
	type call struct{ sequential, measured bool }
	for _, tc := range []struct {
		name                 string
		parallel, sequential time.Duration
		want                 bool
	}{
		{"sequential faster", 10 * time.Millisecond, 7 * time.Millisecond, true},
		{"parallel faster", 7 * time.Millisecond, 10 * time.Millisecond, false},
		{"near tie keeps the backend's own", 10 * time.Millisecond, 9800 * time.Microsecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls []call
			tuner := &opsTuner{set: func(sequential, measured bool) error {
				calls = append(calls, call{sequential, measured})
				return nil
			}}
			current := false
			for range tuneWarmup + 2*tunePerMode + 5 {
				tuner.before()
				if len(calls) > 0 {
					current = calls[len(calls)-1].sequential
				}
				elapsed := tc.parallel
				if current {
					elapsed = tc.sequential
				}
				tuner.after(elapsed)
			}
			assert.True(t, tuner.done)
			assert.Len(t, calls, 2*tunePerMode+1, "one call per measured micro-batch and the final one")
			for i, c := range calls[:2*tunePerMode] {
				assert.Equal(t, call{sequential: i%2 == 1}, c, "measured micro-batch %d", i)
			}
			assert.Equal(t, call{sequential: tc.want, measured: true}, calls[len(calls)-1])
		})
	}
	var none *opsTuner // a runtime without the measurement
	none.before()
	none.after(time.Second)
}
