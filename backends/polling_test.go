package backends

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPollingFollowsCores: a wait spins between polls when every rank of the node has a core, yields the
// processor when ranks outnumber the cores, and yields to goroutines for the in-process engine, whose
// ranks are goroutines.
func TestPollingFollowsCores(t *testing.T) {
	for _, tc := range []struct {
		name      string
		localSize int
		want      pollMode
	}{
		{"a core per rank", 1, pollSpinning},
		{"as many ranks as cores", runtime.NumCPU(), pollSpinning},
		{"more ranks than cores", runtime.NumCPU() + 1, pollYieldingThreads},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Open("single", Topology{WorldSize: 1, LocalSize: tc.localSize, Nodes: 1})
			require.NoError(t, err)
			assert.Equal(t, tc.want, c.polling)
			require.NoError(t, c.Close())
		})
	}
	comms, err := NewInProcessGroup(2)
	require.NoError(t, err)
	for _, c := range comms {
		assert.Equal(t, pollYieldingGoroutines, c.polling)
		require.NoError(t, c.Close())
	}
}

// slowEngine is a one-rank engine whose collectives complete a fixed time after they start.
type slowEngine struct{ after time.Duration }

// completesAt is a request that completes at a given time.
type completesAt time.Time

func (t completesAt) Test() (bool, error) { return !time.Now().Before(time.Time(t)), nil }

func (e slowEngine) request() (Request, error)                { return completesAt(time.Now().Add(e.after)), nil }
func (slowEngine) Rank() int                                  { return 0 }
func (slowEngine) Size() int                                  { return 1 }
func (e slowEngine) StartAllReduceSum(any) (Request, error)   { return e.request() }
func (e slowEngine) StartBroadcast(any, int) (Request, error) { return e.request() }
func (e slowEngine) StartAllGather(any, any) (Request, error) { return e.request() }
func (e slowEngine) StartBarrier() (Request, error)           { return e.request() }
func (slowEngine) Abort(int)                                  {}
func (slowEngine) Close() error                               { return nil }

// TestSpinningWaitsPassThroughTheScheduler: a rank spinning on collectives passes through Go's scheduler
// once per reschedEvery of waiting, never more often, whether one collective lasts long or many follow each
// other; a rank that computes between short collectives, and the in-process engine's waits (which yield to
// goroutines at every poll), add none.
func TestSpinningWaitsPassThroughTheScheduler(t *testing.T) {
	const span = 3 * reschedEvery // below busyPollFor: every wait spins
	require.Less(t, span, busyPollFor)
	for _, tc := range []struct {
		name    string
		polling pollMode
		// Each collective lasts this long, and the rank computes for between them, until span has gone by.
		collective, between time.Duration
		wantAny             bool
	}{
		{"one long collective, spinning", pollSpinning, span, 0, true},
		{"one long collective, yielding the processor", pollYieldingThreads, span, 0, true},
		{"short collectives back to back", pollSpinning, 100 * time.Microsecond, 0, true},
		{"short collectives between compute", pollSpinning, 100 * time.Microsecond, 2 * time.Millisecond, false},
		{"yielding to goroutines", pollYieldingGoroutines, span, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCommunicator("slow", slowEngine{after: tc.collective})
			c.polling = tc.polling
			calls := 0
			c.resched = func() { calls++ }
			start := time.Now()
			for time.Since(start) < span {
				require.NoError(t, c.AllReduceSum(make([]float32, 4)))
				for computing := time.Now(); time.Since(computing) < tc.between; {
				}
			}
			elapsed := time.Since(start)
			if !tc.wantAny {
				assert.Zero(t, calls)
				return
			}
			assert.GreaterOrEqual(t, calls, 1, "a %s spin never passed through the scheduler", elapsed)
			assert.LessOrEqual(t, calls, int(elapsed/reschedEvery)+1, "more than one pass per %s", reschedEvery)
		})
	}
}
