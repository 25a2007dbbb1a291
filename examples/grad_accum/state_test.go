package main

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunningLossRoundTrips: the running loss survives its bytes exactly, NaN included, and refuses bytes
// of another length or format, negative counts, and by name the 32 bytes of earlier versions (which counted
// micro-batches).
func TestRunningLossRoundTrips(t *testing.T) {
	for _, want := range []runningLoss{{}, {stepLossSum: 1.25, stepExamples: 2, epochLossSum: 7.5, epochExamples: 9},
		{stepLossSum: math.NaN(), epochLossSum: math.Inf(1), epochExamples: 1}} {
		data, err := want.MarshalBinary()
		require.NoError(t, err)
		var got runningLoss
		require.NoError(t, got.UnmarshalBinary(data))
		assert.Equal(t, math.Float64bits(want.stepLossSum), math.Float64bits(got.stepLossSum))
		assert.Equal(t, math.Float64bits(want.epochLossSum), math.Float64bits(got.epochLossSum))
		assert.Equal(t, want.stepExamples, got.stepExamples)
		assert.Equal(t, want.epochExamples, got.epochExamples)
	}
	var r runningLoss
	assert.ErrorContains(t, r.UnmarshalBinary(make([]byte, 31)), "want 40 bytes")
	assert.ErrorContains(t, r.UnmarshalBinary(make([]byte, 32)), "earlier version of the demo")
	assert.ErrorContains(t, r.UnmarshalBinary(make([]byte, 40)), "format 0")
	bad, _ := (&runningLoss{epochExamples: -1}).MarshalBinary()
	assert.ErrorContains(t, r.UnmarshalBinary(bad), "negative example counts")
}

// TestRunningLossWeighsExamples: the running means are over examples: a batch of 8 at loss 1 and one of 2
// at loss 6 average to 2, not to the 3.5 of their two losses.
func TestRunningLossWeighsExamples(t *testing.T) {
	var r runningLoss
	assert.True(t, math.IsNaN(r.epochLoss()), "no example yet")
	r.add(1, 8)
	r.add(6, 2)
	assert.Equal(t, 2.0, r.stepLoss())
	assert.Equal(t, 2.0, r.epochLoss())
	assert.Equal(t, int64(10), r.epochExamples)
}

// TestRunningLossMovesToTheMainProcess: on another number of processes the saved running sums are summed
// into the new main process and the others start from zero, so the job's totals stay whole.
func TestRunningLossMovesToTheMainProcess(t *testing.T) {
	var saved [][]byte
	for _, r := range []runningLoss{{epochLossSum: 1, epochExamples: 2}, {epochLossSum: 3, epochExamples: 4},
		{epochLossSum: 5, epochExamples: 6}} {
		data, err := r.MarshalBinary()
		require.NoError(t, err)
		saved = append(saved, data)
	}
	for rank, want := range []runningLoss{{epochLossSum: 9, epochExamples: 12}, {}} {
		data, err := sumRunningLoss(saved, rank, 2)
		require.NoError(t, err)
		var got runningLoss
		require.NoError(t, got.UnmarshalBinary(data))
		assert.Equal(t, want, got, "rank %d", rank)
	}
	_, err := sumRunningLoss([][]byte{{1}}, 0, 2)
	assert.ErrorContains(t, err, "saved rank 0")
}

// TestBestAccuracy: the best accuracy keeps the highest and its epoch, and refuses what is not an
// accuracy.
func TestBestAccuracy(t *testing.T) {
	var b bestAccuracy
	b.observe(0.5, 1)
	b.observe(0.7, 2)
	b.observe(0.6, 3)
	assert.Equal(t, bestAccuracy{accuracy: 0.7, epoch: 2}, b)
	data, err := b.MarshalBinary()
	require.NoError(t, err)
	var got bestAccuracy
	require.NoError(t, got.UnmarshalBinary(data))
	assert.Equal(t, b, got)
	bad, _ := (&bestAccuracy{accuracy: 1.5}).MarshalBinary()
	assert.ErrorContains(t, got.UnmarshalBinary(bad), "is not an accuracy")
}
