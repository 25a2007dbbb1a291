package accumulate_test

import (
	"sync"
	"testing"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
)

// TestReducerSync: the buckets are summed across ranks in place, wherever they live. A bucket held only in
// a buffer of a backend whose buffers are host memory (the pure-Go backend's, where a training step leaves
// its accumulators) is reduced in that buffer: it stays on the device, with no host copy made. A host
// tensor is reduced in its host storage.
func TestReducerSync(t *testing.T) {
	backend := simplego.GetBackend()
	for _, tc := range []struct {
		name     string
		onDevice bool
	}{
		{"device buffer", true},
		{"host tensor", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const ranks = 2
			plan, err := accumulate.NewPlan([]accumulate.Param{param("w", dtypes.Float32, 3)}, 0, 1<<20)
			require.NoError(t, err)
			comms, err := backends.NewInProcessGroup(ranks)
			require.NoError(t, err)
			buckets := make([]*tensors.Tensor, ranks)
			for r := range ranks {
				buckets[r] = tensors.FromValue([]float32{1, 10, 100})
				tensors.MustMutableFlatData(buckets[r], func(flat []float32) {
					for i := range flat {
						flat[i] *= float32(r + 1)
					}
				})
				if tc.onDevice {
					require.NoError(t, buckets[r].MaterializeOnDevice(backend, false, 0))
					buckets[r].FinalizeLocal()
					require.False(t, buckets[r].IsLocal())
				}
			}
			var wg sync.WaitGroup
			errs := make([]error, ranks)
			for r := range ranks {
				wg.Go(func() { errs[r] = accumulate.NewReducer(comms[r], plan).Sync([]*tensors.Tensor{buckets[r]}) })
			}
			wg.Wait()
			for r := range ranks {
				require.NoError(t, errs[r], "rank %d", r)
				if tc.onDevice {
					assert.False(t, buckets[r].IsLocal(), "rank %d: reduced in its device buffer, no host copy", r)
					assert.True(t, buckets[r].IsOnDevice(0), "rank %d", r)
				}
				assert.Equal(t, []float32{3, 30, 300}, tensors.MustCopyFlatData[float32](buckets[r]), "rank %d", r)
				assert.NoError(t, comms[r].Close())
			}
		})
	}
}
