package backends_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
)

// TestActivityWhileWaiting: a rank that waits in an all-reduce its peer never joins says so (collective
// number, call, bytes, how long), the peer's latest collective is the one before, and the timeout ends
// the wait with TimedOut set and the OnTimeout function told before Wait returns.
func TestActivityWhileWaiting(t *testing.T) {
	comms, err := backends.NewInProcessGroup(2, backends.WithTimeout(400*time.Millisecond))
	require.NoError(t, err)
	comms[0].SetDescriber(func() string { return "optimizer step 3" })
	require.NoError(t, inParallel(comms, func(c *backends.Communicator) error { return c.Barrier() }))
	told := make(chan *backends.TimeoutError, 1)
	comms[0].SetOnTimeout(func(e *backends.TimeoutError) {
		told <- e
	})
	done := make(chan error, 1)
	go func() { done <- comms[0].AllReduceSum(backends.BufferOf(make([]float32, 1024))) }()

	var act backends.Activity
	require.Eventually(t, func() bool {
		act = comms[0].Activity()
		return act.Waiting && act.Waited(time.Now()) > 50*time.Millisecond
	}, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, int64(2), act.Seq, "the barrier was #1")
	assert.Equal(t, int64(2), act.WaitSeq)
	assert.Equal(t, "all-reduce of float32[1024]", act.WaitCall)
	assert.Equal(t, backends.OpAllReduce, act.WaitOp)
	assert.Equal(t, 4096, act.WaitBytes)
	assert.Equal(t, "optimizer step 3", act.Context)
	assert.False(t, act.TimedOut)
	assert.NoError(t, act.Broken)

	peer := comms[1].Activity()
	assert.Equal(t, int64(1), peer.Seq, "the peer's latest is the barrier")
	assert.Equal(t, "barrier", peer.Call)
	assert.False(t, peer.Waiting)
	assert.Empty(t, peer.Context, "no describer")

	err = <-done
	var terr *backends.TimeoutError
	require.ErrorAs(t, err, &terr)
	select {
	case e := <-told:
		assert.Same(t, terr, e, "OnTimeout gets the error Wait returns")
	default:
		t.Fatal("OnTimeout was not called before Wait returned")
	}
	act = comms[0].Activity()
	assert.False(t, act.Waiting)
	assert.True(t, act.TimedOut)
	assert.ErrorAs(t, act.Broken, &terr)
	assert.InDelta(t, 400*time.Millisecond, act.Waited(time.Now()), float64(300*time.Millisecond))
}

// TestBeforeCollective: the function runs once before every collective, and the collectives it issues
// itself do not run it again.
func TestBeforeCollective(t *testing.T) {
	comms, err := backends.NewInProcessGroup(2, backends.WithTimeout(10*time.Second))
	require.NoError(t, err)
	var mu sync.Mutex
	calls := map[int]int{}
	for r, c := range comms {
		c.SetBeforeCollective(func() {
			mu.Lock()
			calls[r]++
			mu.Unlock()
			// A collective of its own, as the straggler check issues: it must not recurse.
			assert.NoError(t, c.Barrier())
		})
	}
	require.NoError(t, inParallel(comms, func(c *backends.Communicator) error {
		if err := c.AllReduceSum(backends.BufferOf([]float64{1})); err != nil {
			return err
		}
		return c.Barrier()
	}))
	assert.Equal(t, map[int]int{0: 2, 1: 2}, calls)
	assert.Equal(t, int64(3), comms[0].Stats().Of(backends.OpBarrier).Calls, "two barriers of the hook, one of the loop")

	comms[0].SetBeforeCollective(nil)
	comms[1].SetBeforeCollective(nil)
	require.NoError(t, inParallel(comms, func(c *backends.Communicator) error { return c.Barrier() }))
	assert.Equal(t, map[int]int{0: 2, 1: 2}, calls, "removed")
}

// inParallel runs fn on every communicator at once, as the ranks of a job.
func inParallel(comms []*backends.Communicator, fn func(*backends.Communicator) error) error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Go(func() { errs[i] = fn(c) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
