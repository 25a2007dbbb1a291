package prepare

import (
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // the graph's node types read best unqualified
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu"
	_ "github.com/goaccel/goaccel/cpu/kernels" // goaccel's kernels, as accel links them
)

// TestEstimateCountsConvolutionScratch: the memory estimate of a training step with a convolution counts
// what goaccel's convolution executors take from their scratch pool for the forward convolution and the two
// gradient convolutions (padded inputs, patches, canonical copies), beyond the graph's own values.
func TestEstimateCountsConvolutionScratch(t *testing.T) {
	backend, err := cpu.New(cpu.Config{Backend: cpu.PureGo})
	require.NoError(t, err)
	g := NewGraph(backend, "conv_step")
	x := Parameter(g, "x", shapes.Make(dtypes.Float32, 64, 28, 28, 8))
	k := Parameter(g, "k", shapes.Make(dtypes.Float32, 3, 3, 8, 16))
	loss := ReduceAllSum(Square(Convolve(x, k).PadSame().Done()))
	grads := Gradient(loss, k, x)
	outputs := append([]*Node{loss}, grads...)
	scratch := cpu.ScratchBytes(g)
	assert.Positive(t, scratch, "the convolutions take scratch buffers")
	assert.Equal(t, valuesPeakBytes(g, outputs)+float64(scratch), peakLiveBytes(g, outputs))
}
