package accumulate_test

import (
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
)

// TestOverlapNonFiniteLossStopsEveryRank: a bucket started from inside the step of a rank whose loss is
// NaN leaves poisoned, so that every rank's synced gradients are non-finite, as when the sync follows the
// step (TestReducerNonFiniteLossStopsEveryRank); the step's sync then waits for it rather than sending it
// again.
func TestOverlapNonFiniteLossStopsEveryRank(t *testing.T) {
	const ranks = 2
	comms, err := backends.NewInProcessGroup(ranks)
	require.NoError(t, err)
	finite := make([]bool, ranks)
	errs := make([]error, ranks)
	overlapped := make([]int64, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		reducer, _, acc := modelReducer(t, comms[r], 1, 2)
		wg.Go(func() {
			_, errs[r] = reducer.BeginMicroBatch()
			require.True(t, reducer.ArmOverlap())
			addToAccumulator(t, acc, 1, 2)
			loss := 1.0
			if r == 1 {
				loss = math.NaN()
			}
			// What the step's marked bucket does once computed: hand over the accumulator's memory.
			v, err := acc.Value()
			require.NoError(t, err)
			require.NoError(t, v.MutableFlatData(func(flat any) { reducer.BucketReady(0, flat, loss) }))
			if errs[r] == nil {
				errs[r] = reducer.EndMicroBatch(1, loss)
			}
			if errs[r] == nil {
				finite[r], errs[r] = reducer.Finite()
			}
			overlapped[r] = reducer.OverlappedBuckets()
		})
	}
	wg.Wait()
	for r := range ranks {
		require.NoError(t, errs[r], "rank %d", r)
		assert.False(t, finite[r], "rank %d", r)
		assert.EqualValues(t, 1, overlapped[r], "rank %d", r)
		assert.EqualValues(t, 1, comms[r].Stats().Of(backends.OpAllReduce).Calls, "rank %d: one all-reduce", r)
		assert.NoError(t, comms[r].Close())
	}
}
