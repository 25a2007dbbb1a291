package accel_test

import (
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
)

func TestCollectiveHelpers(t *testing.T) {
	const ranks = 3
	var mu sync.Mutex
	var order []string
	runRanks(t, ranks, nil, func(rank int, acc *accel.Accelerator) error {
		r := float32(rank)
		// Reduce: sum and mean of [r, 2r]; the input is left alone.
		in := tensors.FromValue([]float32{r, 2 * r})
		sum, err := acc.Reduce(in, accel.Sum)
		require.NoError(t, err)
		assert.Equal(t, []float32{3, 6}, tensors.MustCopyFlatData[float32](sum))
		mean, err := acc.Reduce(in, accel.Mean)
		require.NoError(t, err)
		assert.Equal(t, []float32{1, 2}, tensors.MustCopyFlatData[float32](mean))
		assert.Equal(t, []float32{r, 2 * r}, tensors.MustCopyFlatData[float32](in))
		_, err = acc.Reduce(tensors.FromValue([]int32{1}), accel.Mean)
		assert.ErrorContains(t, err, "use Sum")

		// Broadcast from rank 2.
		b := tensors.FromValue([]int64{int64(rank), 7})
		require.NoError(t, acc.Broadcast(b, 2))
		assert.Equal(t, []int64{2, 7}, tensors.MustCopyFlatData[int64](b))

		// Gather: rows ordered by rank; a scalar becomes one row.
		g, err := acc.Gather(tensors.FromValue([][]float32{{r, r}}))
		require.NoError(t, err)
		assert.Equal(t, []int{ranks, 2}, g.Shape().Dimensions)
		assert.Equal(t, []float32{0, 0, 1, 1, 2, 2}, tensors.MustCopyFlatData[float32](g))
		s, err := acc.Gather(tensors.FromScalar(int32(rank)))
		require.NoError(t, err)
		assert.Equal(t, []int32{0, 1, 2}, tensors.MustCopyFlatData[int32](s))

		// Shapes that differ across ranks are an error on every rank, not a hang or garbage.
		_, err = acc.Gather(tensors.FromFlatDataAndDimensions(make([]float32, rank+1), rank+1))
		assert.ErrorContains(t, err, "the ranks disagree on the tensor passed to Gather: rank 0 has (Float32)[1]; "+
			"rank 1 has (Float32)[2]; rank 2 has (Float32)[3]")

		// MainProcessFirst: the main process finishes before any other starts.
		require.NoError(t, acc.MainProcessFirst(func() error {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, map[bool]string{true: "main", false: "other"}[acc.IsMainProcess()])
			return nil
		}))
		assert.Equal(t, rank == 0, acc.IsLocalMainProcess())
		return acc.WaitForEveryone()
	})
	require.Len(t, order, ranks)
	assert.Equal(t, "main", order[0])
}
