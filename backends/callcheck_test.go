package backends_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
)

// MismatchCases are pairs of collectives that ranks must never mix: the last rank makes the second call,
// the others the first. Want is the description of the two calls in the *MismatchError.
var mismatchCases = []struct {
	name        string
	first, last func(c *backends.Communicator) error
	want        []string
}{
	{"broadcast against all-gather",
		func(c *backends.Communicator) error { return c.Broadcast(backends.BufferOf(make([]float32, 4)), 0) },
		func(c *backends.Communicator) error {
			return c.AllGather(backends.BufferOf(make([]float32, 4)), backends.BufferOf(make([]float32, 4*c.Size())))
		},
		[]string{"broadcast of float32[4] from root 0", "all-gather of float32[4]"}},
	{"all-reduce against broadcast",
		func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]float64, 4))) },
		func(c *backends.Communicator) error { return c.Broadcast(backends.BufferOf(make([]float64, 4)), 0) },
		[]string{"all-reduce of float64[4]", "broadcast of float64[4] from root 0"}},
	{"all-reduce lengths",
		func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]float32, 4))) },
		func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]float32, 8))) },
		[]string{"all-reduce of float32[4]", "all-reduce of float32[8]"}},
	{"all-reduce element types",
		func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]float32, 4))) },
		func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]int32, 4))) },
		[]string{"all-reduce of float32[4]", "all-reduce of int32[4]"}},
	{"broadcast roots",
		func(c *backends.Communicator) error { return c.Broadcast(backends.BufferOf(make([]byte, 4)), 0) },
		func(c *backends.Communicator) error { return c.Broadcast(backends.BufferOf(make([]byte, 4)), 1) },
		[]string{"from root 0", "from root 1"}},
	{"barrier against all-reduce",
		func(c *backends.Communicator) error { return c.Barrier() },
		func(c *backends.Communicator) error { return c.AllReduceSum(backends.BufferOf(make([]int64, 2))) },
		[]string{"barrier", "all-reduce of int64[2]"}},
}

// TestCallChecksCatchMismatchedCollectives: with call checks on, ranks that call different collectives
// (or the same one with other lengths, types or roots) all get a *MismatchError naming each call and the
// ranks that made it, instead of garbage or a hang; the communicator stays usable.
func TestCallChecksCatchMismatchedCollectives(t *testing.T) {
	for _, size := range []int{2, 4} {
		for _, tc := range mismatchCases {
			t.Run(fmt.Sprintf("np=%d/%s", size, tc.name), func(t *testing.T) {
				comms, err := backends.NewInProcessGroup(size, backends.WithTimeout(10*time.Second), backends.WithCallChecks())
				require.NoError(t, err)
				errs := make([]error, size)
				var wg sync.WaitGroup
				for r := range size {
					wg.Go(func() {
						call := tc.first
						if r == size-1 {
							call = tc.last
						}
						errs[r] = call(comms[r])
					})
				}
				wg.Wait()
				for r, err := range errs {
					var merr *backends.MismatchError
					require.ErrorAs(t, err, &merr, "rank %d", r)
					require.Len(t, merr.Calls, 2)
					assert.Equal(t, size-1, merr.Calls[1].Ranks[0])
					for _, want := range tc.want {
						assert.Contains(t, err.Error(), want, "rank %d", r)
					}
					assert.Equal(t, errs[0].Error(), err.Error(), "every rank says the same")
					assert.NoError(t, comms[r].Broken(), "a detected mismatch leaves the communicator usable")
				}
			})
		}
	}
}

// TestCallChecksPassMatchingCollectives: with call checks on, matching collectives work as without them.
func TestCallChecksPassMatchingCollectives(t *testing.T) {
	comms, err := backends.NewInProcessGroup(3, backends.WithCallChecks())
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	sums := make([][]float64, 3)
	for r := range 3 {
		wg.Go(func() {
			sums[r] = []float64{float64(r), 1}
			if errs[r] = comms[r].AllReduceSum(backends.BufferOf(sums[r])); errs[r] != nil {
				return
			}
			for _, coll := range collectives {
				if errs[r] = coll.call(comms[r]); errs[r] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	for r := range 3 {
		require.NoError(t, errs[r], "rank %d", r)
		assert.Equal(t, []float64{3, 3}, sums[r])
	}
}
