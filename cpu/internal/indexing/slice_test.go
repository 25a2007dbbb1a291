package indexing

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/require"
)

// randomTensor returns a tensor of dims with distinct values of dtype.
func randomTensor(rng *rand.Rand, dtype dtypes.DType, dims ...int) *tensors.Tensor {
	n := 1
	for _, d := range dims {
		n *= d
	}
	switch dtype {
	case dtypes.Float64:
		flat := make([]float64, n)
		for i := range flat {
			flat[i] = rng.NormFloat64()
		}
		return tensors.FromFlatDataAndDimensions(flat, dims...)
	case dtypes.Int32:
		flat := make([]int32, n)
		for i := range flat {
			flat[i] = rng.Int32()
		}
		return tensors.FromFlatDataAndDimensions(flat, dims...)
	case dtypes.Bool:
		flat := make([]bool, n)
		for i := range flat {
			flat[i] = rng.IntN(2) == 1
		}
		return tensors.FromFlatDataAndDimensions(flat, dims...)
	}
	flat := make([]float32, n)
	for i := range flat {
		flat[i] = rng.Float32()*2 - 1
	}
	return tensors.FromFlatDataAndDimensions(flat, dims...)
}

// TestSliceRuns compares slices computed as copies of runs with simplego's own, bit for bit, and checks
// which ones took the copies: a flat bucket cut into a parameter, rows and blocks of matrices and images,
// strided outer axes, and slices whose runs are too short (strided or narrow innermost axes), which stay
// with simplego.
func TestSliceRuns(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, tc := range []struct {
		dims, starts, limits, strides []int
		dtype                         dtypes.DType
		runs                          bool
	}{
		{dims: []int{101770}, starts: []int{100480}, limits: []int{101760}, dtype: dtypes.Float32, runs: true},
		{dims: []int{1000}, starts: []int{0}, limits: []int{1000}, dtype: dtypes.Float64, runs: true},
		{dims: []int{12, 40}, starts: []int{3, 0}, limits: []int{9, 40}, dtype: dtypes.Float32, runs: true},
		{dims: []int{12, 40}, starts: []int{3, 5}, limits: []int{9, 37}, dtype: dtypes.Int32, runs: true},
		{dims: []int{12, 40}, starts: []int{1, 8}, limits: []int{12, 24}, strides: []int{3, 1}, dtype: dtypes.Float32, runs: true},
		{dims: []int{4, 6, 7, 16}, starts: []int{1, 2, 0, 0}, limits: []int{4, 5, 7, 16}, dtype: dtypes.Float32, runs: true},
		{dims: []int{4, 6, 7, 16}, starts: []int{0, 1, 2, 8}, limits: []int{4, 6, 7, 16}, strides: []int{2, 2, 1, 1}, dtype: dtypes.Bool, runs: true},
		{dims: []int{5, 1, 30}, starts: []int{0, 0, 2}, limits: []int{5, 1, 30}, strides: []int{1, 3, 1}, dtype: dtypes.Float64, runs: true},
		{dims: []int{12, 40}, starts: []int{0, 0}, limits: []int{12, 40}, strides: []int{1, 2}, dtype: dtypes.Float32},
		{dims: []int{12, 40}, starts: []int{0, 3}, limits: []int{12, 7}, dtype: dtypes.Float32},
	} {
		name := fmt.Sprintf("%v[%v:%v:%v] %s", tc.dims, tc.starts, tc.limits, tc.strides, tc.dtype)
		t.Run(name, func(t *testing.T) {
			x := randomTensor(rng, tc.dtype, tc.dims...)
			spec := make([]graph.SliceAxisSpec, len(tc.dims))
			for a := range tc.dims {
				spec[a] = graph.AxisRange(tc.starts[a], tc.limits[a])
				if tc.strides != nil {
					spec[a] = spec[a].Stride(tc.strides[a])
				}
			}
			want, got, calls := runBoth(t, func(x *graph.Node) *graph.Node { return graph.Slice(x, spec...) }, x)
			requireSameBits(t, want[0], got[0], name)
			if tc.runs {
				require.EqualValues(t, 1, calls.Slices, "computed as copies of runs")
			} else {
				require.Zero(t, calls.Slices, "left to simplego")
			}
		})
	}
}
