package accumulate

import (
	"testing"
	"unsafe"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHostFlatAliasesTheDeviceBuffer checks the assumption the in-place sync rests on: on a backend whose
// buffers are host memory, hostFlat of a tensor held only on the device is that buffer's memory, not a
// copy. A write through it must be what the next graph execution reads, the tensor must stay on the
// device with no host copy, and asking again must give the same memory. If a GoMLX release copied here,
// every sync would sum into a copy that training never reads.
func TestHostFlatAliasesTheDeviceBuffer(t *testing.T) {
	backend := simplego.GetBackend()
	require.True(t, backend.HasSharedBuffers(), "the pure-Go backend's buffers are host memory")
	bucket := tensors.FromValue([]float32{1, 2, 3, 4})
	require.NoError(t, bucket.MaterializeOnDevice(backend, false, 0))
	bucket.FinalizeLocal()
	require.False(t, bucket.IsLocal())

	flat, err := hostFlat(bucket)
	require.NoError(t, err)
	f, ok := flat.([]float32)
	require.True(t, ok, "hostFlat returned %T", flat)
	require.Len(t, f, 4)
	for i := range f {
		f[i] *= 10
	}
	again, err := hostFlat(bucket)
	require.NoError(t, err)
	assert.Equal(t, unsafe.Pointer(&f[0]), unsafe.Pointer(&again.([]float32)[0]), "the same memory both times")
	assert.False(t, bucket.IsLocal(), "no host copy was made")

	sum := graph.MustExecOnce(backend, func(x *graph.Node) *graph.Node { return graph.ReduceAllSum(x) }, bucket)
	assert.Equal(t, float32(100), tensors.ToScalar[float32](sum), "the graph reads what was written through hostFlat")

	// A host tensor is reduced in its own storage.
	host := tensors.FromValue([]float64{1, 2})
	flat, err = hostFlat(host)
	require.NoError(t, err)
	flat.([]float64)[1] = 7
	assert.Equal(t, []float64{1, 7}, tensors.MustCopyFlatData[float64](host))
}
