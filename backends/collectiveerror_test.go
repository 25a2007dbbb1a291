package backends_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
)

// TestCollectiveErrorNamesThisRanksCall: without call checks, a collective the engine fails because the
// ranks called different ones names, on each rank, what that rank called there (operation, element kind
// and length, root), the rank, and that only this rank's call is known.
func TestCollectiveErrorNamesThisRanksCall(t *testing.T) {
	comms, err := backends.NewInProcessGroup(2, backends.WithTimeout(10*time.Second))
	require.NoError(t, err)
	calls := [2]func(c *backends.Communicator) error{
		func(c *backends.Communicator) error {
			return c.AllGather(backends.BufferOf(make([]uint8, 2048)), backends.BufferOf(make([]uint8, 4096)))
		},
		func(c *backends.Communicator) error { return c.Broadcast(backends.BufferOf(make([]float32, 10)), 0) },
	}
	want := [2]string{"all-gather of uint8[2048]", "broadcast of float32[10] from root 0"}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			// Collective #1 matches; #2 does not.
			if errs[r] = comms[r].Barrier(); errs[r] == nil {
				errs[r] = calls[r](comms[r])
			}
		})
	}
	wg.Wait()
	for r := range 2 {
		var cerr *backends.CollectiveError
		require.True(t, errors.As(errs[r], &cerr), "rank %d: %v", r, errs[r])
		assert.Equal(t, want[r], cerr.Call)
		assert.Equal(t, r, cerr.Rank)
		msg := errs[r].Error()
		assert.Contains(t, msg, fmt.Sprintf("collective #2 (%s) failed on rank %d: ", want[r], r))
		assert.Contains(t, msg, fmt.Sprintf("the ranks may have called different collectives here (rank %d was in %s;", r, want[r]))
		assert.Contains(t, msg, "the other ranks' errors say what each called")
	}
	for _, c := range comms {
		_ = c.Close()
	}
}

// TestCollectiveErrorWithoutCall: an error built without Call (by code outside the Communicator) still
// reads well, with the operation and its bytes.
func TestCollectiveErrorWithoutCall(t *testing.T) {
	err := &backends.CollectiveError{Op: backends.OpAllReduce, Bytes: 332, Seq: 23, Rank: 1, Context: "optimizer step 3",
		Err: errors.New("MPI_ERR_TRUNCATE: message truncated")}
	assert.Equal(t, "backends: collective #23 (all-reduce of 332 bytes during optimizer step 3) failed on rank 1: "+
		"MPI_ERR_TRUNCATE: message truncated; the ranks may have called different collectives here (rank 1 was in "+
		"all-reduce of 332 bytes; the other ranks' errors say what each called, compare their collective numbers; "+
		"GOACCEL_DEBUG=1 compares every call before it is made)", err.Error())
}

// TestTimeoutErrorNamesThisRanksCall: a collective that no other rank joins ends with the watchdog's error,
// which names what this rank called there.
func TestTimeoutErrorNamesThisRanksCall(t *testing.T) {
	comms, err := backends.NewInProcessGroup(2, backends.WithTimeout(50*time.Millisecond))
	require.NoError(t, err)
	err = comms[0].AllGather(backends.BufferOf(make([]uint8, 8)), backends.BufferOf(make([]uint8, 16)))
	var terr *backends.TimeoutError
	require.ErrorAs(t, err, &terr)
	assert.Equal(t, "all-gather of uint8[8]", terr.Call)
	assert.Contains(t, err.Error(), "collective #1 (all-gather of 8 bytes) did not complete within 50ms: another rank "+
		"failed, hangs, or called a different collective (rank 0 was in all-gather of uint8[8])")
}
