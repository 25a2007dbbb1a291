package elementwise

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
)

// TestReductionsMatchSimplego compares sums, maxima and minima over contiguous axes (leading, trailing,
// middle, all) with simplego's own: results must be bitwise equal, since each output folds its inputs in
// the same order — except float32 sums of runs of 32 or more elements along the last axes, which fold into
// 32 running sums (vec32.Sum): those must agree to float32 rounding. Non-contiguous axes must be left to
// simplego.
func TestReductionsMatchSimplego(t *testing.T) {
	reductions := map[string]func(x *graph.Node, axes ...int) *graph.Node{
		"sum": graph.ReduceSum, "max": graph.ReduceMax, "min": graph.ReduceMin,
	}
	cases := []struct {
		dims, axes []int
		handled    bool
	}{
		{[]int{6, 5, 4, 3}, []int{0, 1, 2}, true}, // a channels-last bias gradient
		{[]int{6, 5, 7}, []int{2}, true},          // softmax's last axis
		{[]int{6, 5, 7}, []int{1}, true},
		{[]int{6, 5, 7}, []int{0, 1, 2}, true},
		{[]int{6, 5, 7}, []int{0, 2}, false},
		{[]int{9, 130}, []int{1}, true}, // a layer norm's statistics
		{[]int{3, 4, 64}, []int{2}, true},
		// Bias gradients of convolutions with 16 and 32 channels, and 16 to 63 channels with a remainder
		// (columns summed in blocks of 16), under a leading axis kept.
		{[]int{4, 7, 7, 16}, []int{0, 1, 2}, true},
		{[]int{2, 5, 5, 32}, []int{0, 1, 2}, true},
		{[]int{3, 11, 37}, []int{1}, true},
		{[]int{2, 9, 63}, []int{1}, true},
	}
	rng := rand.New(rand.NewPCG(11, 12))
	for _, c := range cases {
		for name, reduction := range reductions {
			for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64} {
				t.Run(fmt.Sprintf("%s/%v/%v/%s", name, c.dims, c.axes, dtype), func(t *testing.T) {
					x := computetest.RandomTensor(rng, shapes.Make(dtype, c.dims...))
					fn := func(x, _ *graph.Node) *graph.Node { return reduction(x, c.axes...) }
					before := Calls().Reductions
					got := run(t, true, fn, x, x)
					if c.handled {
						assert.Equal(t, before+1, Calls().Reductions)
					} else {
						assert.Equal(t, before, Calls().Reductions)
					}
					want := run(t, false, fn, x, x)
					runLength := 1
					for _, axis := range c.axes {
						runLength *= c.dims[axis]
					}
					lastAxes := c.axes[len(c.axes)-1] == len(c.dims)-1
					if name == "sum" && dtype == dtypes.Float32 && lastAxes && runLength >= 32 {
						assert.InDeltaSlice(t, want, got, 1e-5)
						return
					}
					assert.Equal(t, want, got)
				})
			}
		}
	}
}

// TestConversionFromBoolMatchesSimplego converts comparison results to floats.
func TestConversionFromBoolMatchesSimplego(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64} {
		t.Run(dtype.String(), func(t *testing.T) {
			x := computetest.RandomTensor(rng, shapes.Make(dtype, 9, 8))
			y := computetest.RandomTensor(rng, shapes.Make(dtype, 9, 8))
			fn := func(x, y *graph.Node) *graph.Node { return graph.ConvertDType(graph.GreaterThan(x, y), dtype) }
			before := Calls().Conversions
			got := run(t, true, fn, x, y)
			assert.Equal(t, before+1, Calls().Conversions)
			assert.Equal(t, run(t, false, fn, x, y), got)
		})
	}
}

// TestConversionFromBytesMatchesSimplego converts every byte value, in runs that do and do not fill the
// table's groups of eight, to floats.
func TestConversionFromBytesMatchesSimplego(t *testing.T) {
	for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64} {
		for _, size := range []int{1, 7, 8, 256, 64 * 784, 1001} {
			t.Run(fmt.Sprintf("%s/%d", dtype, size), func(t *testing.T) {
				pixels := make([]uint8, size)
				for i := range pixels {
					pixels[i] = uint8(i*37 + i/256)
				}
				x := tensors.FromFlatDataAndDimensions(pixels, size)
				unused := tensors.FromValue(float32(0))
				fn := func(x, _ *graph.Node) *graph.Node { return graph.ConvertDType(x, dtype) }
				before := Calls().Conversions
				got := run(t, true, fn, x, unused)
				assert.Equal(t, before+1, Calls().Conversions)
				assert.Equal(t, run(t, false, fn, x, unused), got)
			})
		}
	}
}
