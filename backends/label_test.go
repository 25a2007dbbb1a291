package backends_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
)

func TestLabelString(t *testing.T) {
	for _, tc := range []struct {
		label backends.Label
		want  string
	}{
		{backends.Label{}, ""},
		{backends.BucketLabel(3, 8<<20), "bucket 3 (8.0 MiB)"},
		{backends.BucketLabel(0, 512), "bucket 0 (512 bytes)"},
		{backends.Label{What: "parameters", Index: -1}, "parameters"},
		{backends.Label{What: "block", Index: 2}, "block 2"},
	} {
		assert.Equal(t, tc.want, tc.label.String())
		assert.Equal(t, tc.want == "", tc.label.IsZero())
	}
}

// TestLabelsAndObserver: a label goes to the next collective only — not to the collectives the call checks
// or a SetBeforeCollective function issue first — shows in Activity, and reaches the observer with the
// collective's start, wait and end in order.
func TestLabelsAndObserver(t *testing.T) {
	comms, err := backends.NewInProcessGroup(2)
	require.NoError(t, err)
	var mu sync.Mutex
	var records [2][]backends.CollectiveRecord
	for r, c := range comms {
		c.SetObserver(func(rec backends.CollectiveRecord) {
			mu.Lock()
			records[r] = append(records[r], rec)
			mu.Unlock()
		})
		c.SetCallChecks(true)
		c.SetBeforeCollective(func() { _ = c.Barrier() })
	}
	require.NoError(t, inParallel(comms, func(c *backends.Communicator) error {
		c.SetNextLabel(backends.BucketLabel(1, 4096))
		if err := c.AllReduceSum(backends.BufferOf(make([]float32, 1024))); err != nil {
			return err
		}
		return c.AllReduceSum(backends.BufferOf(make([]float32, 8)))
	}))
	for r, c := range comms {
		act := c.Activity()
		assert.True(t, act.Label.IsZero(), "rank %d: the second all-reduce took no label", r)
		var labelled []backends.CollectiveRecord
		for _, rec := range records[r] {
			if !rec.Label.IsZero() {
				labelled = append(labelled, rec)
			}
		}
		require.Len(t, labelled, 1, "rank %d: one labelled collective of %d", r, len(records[r]))
		rec := labelled[0]
		assert.Equal(t, backends.OpAllReduce, rec.Op)
		assert.Equal(t, "all-reduce of float32[1024]", rec.Call())
		assert.Equal(t, "bucket 1 (4.0 KiB)", rec.Label.String())
		assert.Equal(t, 4096, rec.Bytes)
		assert.False(t, rec.Failed)
		assert.False(t, rec.WaitBegan.Before(rec.Started))
		assert.False(t, rec.Ended.Before(rec.WaitBegan))
		// The call checks' all-gathers and the barriers came before, unlabelled: 2 collectives each.
		assert.Greater(t, len(records[r]), 4, "rank %d: the checks and barriers are observed too", r)
	}
	for _, c := range comms {
		c.SetObserver(nil)
		c.SetBeforeCollective(nil)
	}
}

// TestLabelInActivityWhileWaiting: a rank waiting in a labelled collective says which bucket.
func TestLabelInActivityWhileWaiting(t *testing.T) {
	comms, err := backends.NewInProcessGroup(2, backends.WithTimeout(300*time.Millisecond))
	require.NoError(t, err)
	done := make(chan error, 1)
	comms[0].SetNextLabel(backends.BucketLabel(7, 4096))
	go func() { done <- comms[0].AllReduceSum(backends.BufferOf(make([]float32, 1024))) }()
	require.Eventually(t, func() bool { return comms[0].Activity().Waiting }, 5*time.Second, time.Millisecond)
	act := comms[0].Activity()
	assert.Equal(t, "bucket 7 (4.0 KiB)", act.WaitLabel.String())
	assert.Equal(t, "bucket 7 (4.0 KiB)", act.Label.String())
	require.Error(t, <-done)
}

// TestLabelAllocatesNothing: labelling a collective and the observer hook cost no
// allocation when no observer is set.
func TestLabelAllocatesNothing(t *testing.T) {
	comms, err := backends.NewInProcessGroup(1)
	require.NoError(t, err)
	c := comms[0]
	buf := backends.BufferOf(make([]float32, 64))
	plain := testing.AllocsPerRun(200, func() { _ = c.AllReduceSum(buf) })
	labelled := testing.AllocsPerRun(200, func() {
		c.SetNextLabel(backends.BucketLabel(2, 256))
		_ = c.AllReduceSum(buf)
	})
	assert.Equal(t, plain, labelled, "a label adds no allocation")
	assert.Zero(t, testing.AllocsPerRun(200, func() { c.SetNextLabel(backends.BucketLabel(2, 256)) }))
}
