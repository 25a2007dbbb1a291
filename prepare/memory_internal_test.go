package prepare

import (
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu"
)

// TestPeakLiveBytesMultiOutputNodes: the memory estimate walks graphs holding a node with several outputs
// (RNGBitGenerator, which every dropout builds: new state and random bits), whose own shape is invalid —
// reading its memory panicked with `unknown dtype "InvalidDType"`. Its outputs are counted once, through
// the split nodes after it.
func TestPeakLiveBytesMultiOutputNodes(t *testing.T) {
	backend, err := cpu.New(cpu.Config{Backend: "go"})
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		build func(g *Graph) []*Node
		want  float64
	}{
		{"random uniform", func(g *Graph) []*Node {
			state := Parameter(g, "state", RNGStateShape)
			newState, values := RandomUniform(state, shapes.Make(dtypes.Float32, 4, 8))
			return []*Node{newState, values}
		}, 0},
		{"one output", func(g *Graph) []*Node {
			x := Parameter(g, "x", shapes.Make(dtypes.Float32, 16))
			return []*Node{Add(x, x)}
		}, 16 * 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGraph(backend, tc.name)
			defer g.Finalize()
			outputs := tc.build(g)
			var peak float64
			require.NotPanics(t, func() { peak = peakLiveBytes(g, outputs) })
			if tc.want > 0 {
				assert.Equal(t, tc.want, peak)
				return
			}
			// At least the outputs themselves: the state and 32 float32 values.
			assert.GreaterOrEqual(t, peak, float64(RNGStateShape.Memory()+4*8*4))
			for _, n := range g.Nodes() {
				if n.NumOutputs() > 1 {
					return
				}
			}
			t.Fatal("the graph has no node with several outputs: the test proves nothing")
		})
	}
}
