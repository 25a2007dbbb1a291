package accel_test

import (
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
)

// TestGatherUnevenRefusesOtherTrailingShapes: only the first dimension may differ; another trailing shape
// is the same error on every rank, naming the shapes.
func TestGatherUnevenRefusesOtherTrailingShapes(t *testing.T) {
	for _, call := range []string{"GatherUneven", "PadAcrossProcesses"} {
		t.Run(call, func(t *testing.T) {
			runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
				x := tensors.FromShape(tensors.FromValue([][]float32{{1, 2}}).Shape())
				if rank == 1 {
					x = tensors.FromValue([][]float32{{1, 2, 3}})
				}
				var err error
				if call == "GatherUneven" {
					_, err = acc.GatherUneven(x)
				} else {
					_, _, err = acc.PadAcrossProcesses(x, 0)
				}
				require.Error(t, err)
				assert.Contains(t, err.Error(), "(Float32)[* 2]")
				assert.Contains(t, err.Error(), "(Float32)[* 3]")
				return nil
			})
		})
	}
}

// TestGatherUnevenEmptyRank: a rank with no rows contributes none.
func TestGatherUnevenEmptyRank(t *testing.T) {
	got := make([][]int32, 3)
	runRanks(t, 3, nil, func(rank int, acc *accel.Accelerator) error {
		values := make([]int32, rank)
		for i := range values {
			values[i] = int32(10*rank + i)
		}
		all, err := acc.GatherUneven(tensors.FromFlatDataAndDimensions(values, rank))
		if err == nil {
			got[rank] = tensors.MustCopyFlatData[int32](all)
		}
		return err
	})
	for r := range 3 {
		assert.Equal(t, []int32{10, 20, 21}, got[r], "rank %d", r)
	}
}
