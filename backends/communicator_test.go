package backends_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
)

// collective is one call of each kind, as a rank would make it.
type collective struct {
	op   backends.Op
	call func(c *backends.Communicator) error
}

var collectives = []collective{
	{backends.OpAllReduce, func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]float32, 16))) }},
	{backends.OpBroadcast, func(c *backends.Communicator) error { return c.Broadcast(backends.BufferOf(make([]int64, 4)), 0) }},
	{backends.OpAllGather, func(c *backends.Communicator) error {
		return c.AllGather(backends.BufferOf(make([]byte, 3)), backends.BufferOf(make([]byte, 3*c.Size())))
	}},
	{backends.OpBarrier, func(c *backends.Communicator) error { return c.Barrier() }},
}

func TestWatchdogNamesTheOpWhenARankNeverJoins(t *testing.T) {
	const timeout = 150 * time.Millisecond
	for _, coll := range collectives {
		t.Run(coll.op.String(), func(t *testing.T) {
			comms, err := backends.NewInProcessGroup(2, backends.WithTimeout(timeout))
			require.NoError(t, err)
			comms[0].SetDescriber(func() string { return "optimizer step 12" })

			// Rank 1 never joins.
			start := time.Now()
			err = coll.call(comms[0])
			elapsed := time.Since(start)

			var terr *backends.TimeoutError
			require.ErrorAs(t, err, &terr)
			assert.Equal(t, coll.op, terr.Op)
			assert.Equal(t, 0, terr.Rank)
			assert.Equal(t, timeout, terr.After)
			assert.Equal(t, "optimizer step 12", terr.Context)
			assert.Contains(t, err.Error(), coll.op.String())
			assert.Contains(t, err.Error(), "during optimizer step 12")
			assert.GreaterOrEqual(t, elapsed, timeout)
			assert.Less(t, elapsed, timeout+time.Second, "the watchdog fired late")

			// The communicator is broken from now on, and says why, without waiting again.
			assert.ErrorIs(t, comms[0].Broken(), terr)
			start = time.Now()
			err = comms[0].Barrier()
			require.ErrorContains(t, err, "unusable after an earlier failure")
			assert.ErrorAs(t, err, &terr)
			assert.Less(t, time.Since(start), timeout)
		})
	}
}

func TestAbortUnblocksTheOtherRanks(t *testing.T) {
	comms, err := backends.NewInProcessGroup(3, backends.WithTimeout(30*time.Second))
	require.NoError(t, err)
	errs := make([]error, 2)
	elapsed := make([]time.Duration, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Go(func() {
			start := time.Now()
			errs[rank] = comms[rank].AllReduceSum(backends.BufferOf(make([]float64, 8)))
			elapsed[rank] = time.Since(start)
		})
	}
	time.Sleep(50 * time.Millisecond) // let ranks 0 and 1 wait in the all-reduce
	comms[2].Abort(1)
	wg.Wait()
	for rank := range 2 {
		assert.ErrorIs(t, errs[rank], backends.ErrAborted, "rank %d", rank)
		assert.Less(t, elapsed[rank], 5*time.Second, "rank %d waited for the timeout instead", rank)
	}
	// Nothing can start on an aborted group.
	assert.ErrorIs(t, comms[2].Barrier(), backends.ErrAborted)
}

func TestClosingABrokenCommunicatorAbortsTheGroup(t *testing.T) {
	comms, err := backends.NewInProcessGroup(2, backends.WithTimeout(100*time.Millisecond))
	require.NoError(t, err)
	var terr *backends.TimeoutError
	require.ErrorAs(t, comms[0].Barrier(), &terr)

	// Rank 1 arrives late: its barrier completes against rank 0's abandoned one, and it goes on to wait in
	// an all-reduce that rank 0 will never start. Closing rank 0's broken communicator must end that wait.
	comms[1].SetTimeout(30 * time.Second)
	done := make(chan error, 1)
	go func() {
		if err := comms[1].Barrier(); err != nil {
			done <- err
			return
		}
		done <- comms[1].AllReduceSum(backends.BufferOf(make([]int32, 2)))
	}()
	require.Eventually(t, func() bool { return comms[1].Stats().Calls() == 2 }, 5*time.Second, time.Millisecond)
	closeErr := comms[0].Close()
	require.ErrorAs(t, closeErr, &terr, "Close returns why it aborted")
	assert.ErrorContains(t, closeErr, "rank 0 aborted the job")
	select {
	case err := <-done:
		assert.ErrorIs(t, err, backends.ErrAborted)
	case <-time.After(5 * time.Second):
		t.Fatal("rank 1 still waiting after rank 0 closed its broken communicator")
	}
	assert.ErrorIs(t, comms[0].Barrier(), backends.ErrClosed)
}

func TestMismatchedCollectivesAreReported(t *testing.T) {
	tests := []struct {
		name    string
		calls   [2]func(c *backends.Communicator) error
		wantErr string
	}{
		{
			name: "different operations",
			calls: [2]func(c *backends.Communicator) error{
				func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]float32, 4))) },
				func(c *backends.Communicator) error { return c.Broadcast(backends.BufferOf(make([]float32, 4)), 0) },
			},
			wantErr: "collective #0: rank 1 called broadcast (root 0) while another rank called all-reduce (root 0)",
		},
		{
			name: "different broadcast roots",
			calls: [2]func(c *backends.Communicator) error{
				func(c *backends.Communicator) error { return c.Broadcast(backends.BufferOf(make([]byte, 4)), 0) },
				func(c *backends.Communicator) error { return c.Broadcast(backends.BufferOf(make([]byte, 4)), 1) },
			},
			wantErr: "rank 1 called broadcast (root 1) while another rank called broadcast (root 0)",
		},
		{
			name: "different lengths",
			calls: [2]func(c *backends.Communicator) error{
				func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]float64, 4))) },
				func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]float64, 5))) },
			},
			wantErr: "mismatched collective buffers",
		},
		{
			name: "different element kinds",
			calls: [2]func(c *backends.Communicator) error{
				func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]float32, 4))) },
				func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]int32, 4))) },
			},
			wantErr: "mismatched collective buffers",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			comms, err := backends.NewInProcessGroup(2, backends.WithTimeout(10*time.Second))
			require.NoError(t, err)
			// Rank 0 posts first (the counters show when its call reached the engine), so the mismatch is
			// detected on rank 1's call.
			errs := make([]error, 2)
			done := make(chan struct{})
			go func() {
				defer close(done)
				errs[0] = tt.calls[0](comms[0])
			}()
			require.Eventually(t, func() bool { return comms[0].Stats().Calls() == 1 }, 5*time.Second, time.Millisecond)
			errs[1] = tt.calls[1](comms[1])
			<-done
			for rank, err := range errs {
				require.Error(t, err, "rank %d", rank)
				assert.Contains(t, err.Error(), tt.wantErr, "rank %d", rank)
				assert.NotErrorIs(t, err, backends.ErrAborted)
				var terr *backends.TimeoutError
				assert.False(t, errors.As(err, &terr), "a mismatch is reported, not timed out")
			}
		})
	}
}

func TestCollectivesAfterCloseFail(t *testing.T) {
	comm := backends.NewSingle()
	require.NoError(t, comm.Close())
	require.NoError(t, comm.Close(), "closing twice is harmless")
	for _, coll := range collectives {
		assert.ErrorIs(t, coll.call(comm), backends.ErrClosed, coll.op.String())
	}
}

// TestParseTimeout: the collective timeout's text form, as TimeoutEnvVar gives it, is a duration or a
// number of seconds, and must be positive.
func TestParseTimeout(t *testing.T) {
	tests := []struct {
		text    string
		want    time.Duration
		wantErr string
	}{
		{"45s", 45 * time.Second, ""},
		{"5", 5 * time.Second, ""},
		{"2.5", 2500 * time.Millisecond, ""},
		{"not a duration", 0, `"not a duration" is neither a duration (such as 30s or 10m) nor a number of seconds`},
		{"-3s", 0, `"-3s" is not a positive duration`},
		{"0", 0, `"0" is not a positive duration`},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			got, err := backends.ParseTimeout(tt.text)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestOpenErrors(t *testing.T) {
	one := backends.Topology{Rank: 0, WorldSize: 1, LocalSize: 1, Nodes: 1, Source: "default"}
	two := backends.Topology{Rank: 1, WorldSize: 2, LocalRank: 1, LocalSize: 2, Nodes: 1, Source: "openmpi"}
	tests := []struct {
		name    string
		engine  string
		topo    backends.Topology
		wantErr string
	}{
		{"unknown engine", "carrier-pigeon", one, `collective engine "carrier-pigeon" is not registered`},
		{"mpi not linked into this test binary", "mpi", two, `collective engine "mpi" is not registered`},
		{"single for two ranks", "single", two, `engine "single" cannot serve a world of 2 ranks`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := backends.Open(tt.engine, tt.topo)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
	assert.Contains(t, backends.Engines(), "single")
	assert.True(t, backends.EngineRegistered("single"))
	single := func(backends.Topology) (backends.Engine, error) { return nil, nil }
	assert.PanicsWithValue(t, `backends: engine "single" registered twice`,
		func() { backends.RegisterEngine("single", single) }, "a name can be registered once")
	assert.PanicsWithValue(t, `backends: engine "pigeon" registered with a nil factory`,
		func() { backends.RegisterEngine("pigeon", nil) })
	assert.NotContains(t, backends.Engines(), "pigeon")
}

func TestStatsArithmetic(t *testing.T) {
	comms, err := backends.NewInProcessGroup(1)
	require.NoError(t, err)
	c := comms[0]
	before := c.Stats()
	require.NoError(t, c.AllReduceSum(backends.BufferOf(make([]float64, 10))))
	require.NoError(t, c.Broadcast(backends.BufferOf(make([]int32, 3)), 0))
	require.NoError(t, c.Barrier())
	d := c.Stats().Sub(before)
	assert.Equal(t, int64(3), d.Calls())
	assert.Equal(t, int64(80+12), d.Bytes())
	assert.Equal(t, backends.OpStats{Calls: 1, Bytes: 80, Wait: d.Of(backends.OpAllReduce).Wait},
		d.Of(backends.OpAllReduce))
	assert.GreaterOrEqual(t, d.Wait(), time.Duration(0))
	assert.Equal(t, "all-gather", backends.OpAllGather.String())
	assert.Equal(t, "Op(9)", backends.Op(9).String())
}

// TestPendingWaitFromSeveralGoroutines: goroutines waiting on one collective all get its result, once it
// completes; the wait itself runs once (under -race, the result is never written unguarded).
func TestPendingWaitFromSeveralGoroutines(t *testing.T) {
	comms, err := backends.NewInProcessGroup(2, backends.WithTimeout(30*time.Second))
	require.NoError(t, err)
	bufs := [][]float64{{1, 2}, {10, 20}}
	pendings := make([]*backends.Pending, 2)
	for r := range 2 {
		pendings[r], err = comms[r].AllReduceSumAsync(backends.BufferOf(bufs[r]))
		require.NoError(t, err)
	}
	const waiters = 4
	errs := make([]error, 2*waiters)
	var wg sync.WaitGroup
	for r := range 2 {
		for w := range waiters {
			wg.Go(func() { errs[r*waiters+w] = pendings[r].Wait() })
		}
	}
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "waiter %d", i)
	}
	for r := range 2 {
		assert.Equal(t, []float64{11, 22}, bufs[r], "rank %d", r)
		assert.EqualValues(t, 1, comms[r].Stats().Of(backends.OpAllReduce).Calls, "rank %d", r)
		require.NoError(t, comms[r].Close())
	}
}
