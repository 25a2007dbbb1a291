package accel

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/prepare"
)

// TestTimelineOffCostsNothing: with the timeline off (a nil recorder) the calls on the training path are a
// nil check: no allocation, no clock reading.
func TestTimelineOffCostsNothing(t *testing.T) {
	var off *timeline
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		off.span("save checkpoint", off.now())
		off.instant("restart 1")
	}))
	assert.Zero(t, off.now())
	a := &Accelerator{}
	a.startTimeline()
	assert.Nil(t, a.timeline, "no path, no recorder")
}

// TestClockOffsetInterpolates: two alignments, one at each end of the run, follow a drift between the
// clocks; one alignment is used as it is; none leaves the clock alone.
func TestClockOffsetInterpolates(t *testing.T) {
	for _, tc := range []struct {
		name   string
		clocks []clockSample
		at     int64
		want   int64
	}{
		{"none", nil, 500, 0},
		{"one", []clockSample{{at: 100, offset: -40}}, 9000, -40},
		{"halfway", []clockSample{{at: 0, offset: 1000}, {at: 1000, offset: 2000}}, 500, 1500},
		{"before the first", []clockSample{{at: 100, offset: 0}, {at: 200, offset: 100}}, 0, -100},
		{"same moment", []clockSample{{at: 5, offset: 1}, {at: 5, offset: 3}}, 5, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := &timeline{clocks: tc.clocks}
			assert.Equal(t, tc.want, tl.offset(tc.at))
		})
	}
}

// BenchmarkTimelineRecord is the recorder's own cost per event: what a step pays with the timeline on,
// times its few events (a micro-batch, its pass, an optimizer step, one all-reduce and wait per bucket).
func BenchmarkTimelineRecord(b *testing.B) {
	tl := newTimeline("unused", 0, 1)
	now := time.Now()
	p := prepare.Phase{Kind: prepare.PhaseForwardBackward, Index: 3, Syncs: true}
	r := backends.CollectiveRecord{Seq: 4, Op: backends.OpAllReduce, Bytes: 4096, Label: backends.BucketLabel(1, 4096),
		Started: now, WaitBegan: now, Ended: now}
	b.ReportAllocs()
	for i := range b.N {
		if i%(maxTimelineEvents/2) == 0 {
			tl.chunks, tl.events = nil, 0 // stay under the cap: measure recording, not counting drops
		}
		tl.onPhase(p, now, now)
		tl.onCollective(r)
	}
}
