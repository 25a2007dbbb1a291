package accumulate_test

import (
	"bytes"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
)

// FuzzSavedState: whatever a checkpoint's accumulators file holds and whatever world size and cycle flag
// its state.json claims, resuming either refuses with an error or gives this rank exactly its own bytes of
// the file (same world size) or empty accumulators (another world size, at a step boundary), each of its
// bucket's size; never a panic, never another rank's bytes.
func FuzzSavedState(f *testing.F) {
	comms, err := backends.NewInProcessGroup(2)
	require.NoError(f, err)
	plan, err := accumulate.NewPlan([]accumulate.Param{
		{Name: "w", Shape: shapes.Make(dtypes.Float32, 3, 2)},
		{Name: "b", Shape: shapes.Make(dtypes.Float64, 2)},
	}, 8, 64)
	require.NoError(f, err)
	reducers := make([]*accumulate.Reducer, len(comms))
	for r, comm := range comms {
		ctx := context.New()
		var accums []*context.Variable
		for b, bucket := range plan.Buckets {
			accums = append(accums, ctx.VariableWithValue(string(rune('a'+b)), make([]float32, bucket.Bytes()/4)))
		}
		state, err := accumulate.NewGradientState(2, false)
		require.NoError(f, err)
		reducers[r] = accumulate.NewReducer(comm, plan, accumulate.WithAccumulators(accums),
			accumulate.WithGradientState(state))
	}
	total := 0
	for _, n := range reducers[0].AccumulatorBytes() {
		total += n
	}
	f.Add(bytes.Repeat([]byte{7}, 2*total), 2, true)
	f.Add(bytes.Repeat([]byte{1}, total), 1, false)
	f.Add(bytes.Repeat([]byte{1}, 3*total), 3, true)
	f.Add([]byte{}, 0, false)
	f.Add([]byte{1, 2, 3}, -1, true)
	f.Fuzz(func(t *testing.T, blob []byte, savedRanks int, accumulating bool) {
		for rank, r := range reducers {
			mine, err := r.SavedState(blob, savedRanks, accumulating)
			if err != nil {
				continue
			}
			sizes := r.AccumulatorBytes()
			require.Len(t, mine.Accumulators, len(sizes))
			assert.Equal(t, accumulating, mine.Accumulating)
			offset := 0
			for b, n := range sizes {
				got := mine.Accumulators[b]
				require.Len(t, got, n, "bucket %d", b)
				if savedRanks == len(comms) {
					assert.Equal(t, blob[offset+rank*n:offset+(rank+1)*n], got, "rank %d, bucket %d", rank, b)
				} else {
					assert.False(t, accumulating, "a partial cycle of another world size must be refused")
					assert.Equal(t, make([]byte, n), got)
				}
				offset += n * savedRanks
			}
			assert.NoError(t, r.CheckRestore(mine))
		}
	})
}
