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

func (e slowEngine) request() (Request, error)                             { return completesAt(time.Now().Add(e.after)), nil }
func (slowEngine) Rank() int                                               { return 0 }
func (slowEngine) Size() int                                               { return 1 }
func (e slowEngine) StartAllReduceSum(Buffer) (Request, error)             { return e.request() }
func (e slowEngine) StartReduceScatterSum(Buffer, Buffer) (Request, error) { return e.request() }
func (e slowEngine) StartBroadcast(Buffer, int) (Request, error)           { return e.request() }
func (e slowEngine) StartAllGather(Buffer, Buffer) (Request, error)        { return e.request() }
func (e slowEngine) StartBarrier() (Request, error)                        { return e.request() }
func (slowEngine) Abort(int)                                               {}
func (slowEngine) Close() error                                            { return nil }

// TestSpinningWaitsPassThroughTheScheduler: every spinning wait starts a new time slice when it begins, and
// a long one every reschedEvery while it polls, never more often; the in-process engine's waits, which yield
// to goroutines at every poll, add none.
func TestSpinningWaitsPassThroughTheScheduler(t *testing.T) {
	const span = 15 * reschedEvery // below busyPollFor: every wait spins
	require.Less(t, span, busyPollFor)
	for _, tc := range []struct {
		name       string
		polling    pollMode
		collective time.Duration // each lasts this long; the loop runs them until span has gone by
		wantAny    bool
	}{
		{"one long collective, spinning", pollSpinning, span, true},
		{"one long collective, yielding the processor", pollYieldingThreads, span, true},
		{"short collectives", pollSpinning, reschedEvery / 10, true},
		{"yielding to goroutines", pollYieldingGoroutines, span, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCommunicator("slow", slowEngine{after: tc.collective})
			c.polling = tc.polling
			slices := 0
			c.resched = func() { slices++ }
			waits := 0
			start := time.Now()
			for time.Since(start) < span {
				require.NoError(t, c.AllReduceSum(BufferOf(make([]float32, 4))))
				waits++
			}
			elapsed := time.Since(start)
			if !tc.wantAny {
				assert.Zero(t, slices)
				return
			}
			assert.GreaterOrEqual(t, slices, waits, "a wait began without a new time slice")
			if tc.collective >= span {
				assert.Greater(t, slices, waits, "a %s wait never started another slice", elapsed)
			}
			assert.LessOrEqual(t, slices, waits+int(elapsed/reschedEvery), "more than one slice per %s", reschedEvery)
		})
	}
}
