package accumulate_test

import (
	"encoding/binary"
	"math"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
)

// TestCheckResume: a checkpoint at an optimizer-step boundary resumes whatever the world size, K and
// sync-each-batch; one inside a cycle only with the same three, and the refusal says to save at a step
// boundary.
func TestCheckResume(t *testing.T) {
	gs, err := accumulate.NewGradientState(3, false)
	require.NoError(t, err)
	boundary := accumulate.SavedCycle{WorldSize: 2, Steps: 4, SyncEachBatch: true}
	inside := accumulate.SavedCycle{WorldSize: 2, Steps: 3, Accumulating: true,
		Position: accumulate.Position{StepInCycle: 2, ScaledMicroBatches: 2}}
	for _, tc := range []struct {
		name      string
		saved     accumulate.SavedCycle
		worldSize int
		want      string // "" accepts
	}{
		{"boundary, another world size and K", boundary, 4, ""},
		{"boundary, one process", boundary, 1, ""},
		{"inside, same configuration", inside, 2, ""},
		{"inside, another world size", inside, 4, "saved by 2 processes and this run has 4"},
		{"inside, another K", accumulate.SavedCycle{WorldSize: 2, Steps: 5, Accumulating: true,
			Position: accumulate.Position{StepInCycle: 1, ScaledMicroBatches: 1}}, 2, "saved with 5 accumulation steps and this run uses 3"},
		{"inside, another sync-each-batch", accumulate.SavedCycle{WorldSize: 2, Steps: 3, SyncEachBatch: true,
			Accumulating: true, Position: accumulate.Position{StepInCycle: 1, ScaledMicroBatches: 1}}, 2,
			"sync-each-batch true and this run has false"},
		{"counted micro-batches without accumulators", accumulate.SavedCycle{WorldSize: 1, Steps: 3,
			Position: accumulate.Position{UnscaledMicroBatches: 1}}, 2, "saved by 1 processes and this run has 2"},
		{"inside, position out of range", accumulate.SavedCycle{WorldSize: 2, Steps: 3, Accumulating: true,
			Position: accumulate.Position{StepInCycle: 7}}, 2, "cannot restore position"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := gs.CheckResume(tc.saved, tc.worldSize)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			if tc.saved.WorldSize != tc.worldSize || tc.saved.Steps != 3 || tc.saved.SyncEachBatch {
				require.ErrorIs(t, err, accumulate.ErrInsideCycle)
				assert.Contains(t, err.Error(), "save at an optimizer-step boundary")
			}
		})
	}
	assert.Equal(t, accumulate.Position{}, boundary.ResumePosition())
	assert.Equal(t, inside.Position, inside.ResumePosition())
}

// TestSavedStateAcrossWorldSizes: the gathered accumulators of 2 ranks give each of 2 ranks its own partial
// sums back; on 3 ranks a checkpoint at a step boundary gives every rank empty accumulators, and one inside
// a cycle is refused; a blob of the wrong size is refused.
func TestSavedStateAcrossWorldSizes(t *testing.T) {
	const n = 3
	comms, err := backends.NewInProcessGroup(2)
	require.NoError(t, err)
	blobs := make([][]byte, 2)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := range 2 {
		wg.Go(func() {
			red, gs, acc := modelReducer(t, comms[r], 4, n)
			errs[r] = gs.Accumulate(func() error {
				addToAccumulator(t, acc, float32(r+1), float32(10*(r+1)), float32(100*(r+1)))
				return red.EndMicroBatch(gs.MicroBatchScale(), 1)
			})
			if errs[r] != nil {
				return
			}
			var s accumulate.ReducerState
			if s, errs[r] = red.State(); errs[r] == nil {
				blobs[r], errs[r] = red.GatherState(s)
			}
		})
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	assert.Nil(t, blobs[1], "only the main process keeps the gathered accumulators")
	blob := blobs[0]
	require.Len(t, blob, 2*4*n)

	floatsOf := func(b []byte) []float32 {
		out := make([]float32, len(b)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return out
	}
	same, err := backends.NewInProcessGroup(2)
	require.NoError(t, err)
	for r := range 2 {
		red, _, _ := modelReducer(t, same[r], 4, n)
		s, err := red.SavedState(blob, 2, true)
		require.NoError(t, err)
		assert.True(t, s.Accumulating)
		assert.Equal(t, []float32{float32(r + 1), float32(10 * (r + 1)), float32(100 * (r + 1))}, floatsOf(s.Accumulators[0]),
			"rank %d gets its own partial sums", r)
	}
	three, err := backends.NewInProcessGroup(3)
	require.NoError(t, err)
	red, _, acc := modelReducer(t, three[2], 4, n)
	_, err = red.SavedState(blob, 2, true)
	require.ErrorIs(t, err, accumulate.ErrInsideCycle)
	assert.Contains(t, err.Error(), "partial sums of 2 processes and this run has 3")
	addToAccumulator(t, acc, 7, 7, 7)
	s, err := red.SavedState(blob, 2, false)
	require.NoError(t, err)
	require.NoError(t, red.Restore(s))
	assert.Equal(t, []float32{0, 0, 0}, tensors.MustCopyFlatData[float32](must(acc.Value())),
		"a step-boundary checkpoint leaves every rank of the new world with empty accumulators")
	_, err = red.SavedState(blob[:len(blob)-1], 2, false)
	assert.ErrorContains(t, err, "need 24")
}
