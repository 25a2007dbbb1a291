package prepare_test

import (
	"fmt"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/prepare"
)

// numbered returns a tensor of the given dims whose element at flat position i is i + offset.
func numbered[T float32 | float64 | int32 | int64](offset int, dims ...int) (*tensors.Tensor, []T) {
	size := 1
	for _, d := range dims {
		size *= d
	}
	data := make([]T, size)
	for i := range data {
		data[i] = T(i + offset)
	}
	return tensors.FromFlatDataAndDimensions(data, dims...), data
}

// wantRows is what gathering indices from flat data with rowSize elements per example must give.
func wantRows[T any](flat []T, rowSize int, indices []int) []T {
	out := []T{}
	for _, idx := range indices {
		out = append(out, flat[idx*rowSize:(idx+1)*rowSize]...)
	}
	return out
}

// assertRows compares gathered data, treating an empty batch's nil data as empty.
func assertRows[T any](t *testing.T, want, got []T, indices []int) {
	t.Helper()
	if len(want) == 0 {
		assert.Empty(t, got, "%v", indices)
		return
	}
	assert.Equal(t, want, got, "%v", indices)
}

func TestTensorSourceGathers(t *testing.T) {
	const n = 5
	indicesCases := [][]int{{0}, {4, 0, 2}, {3, 3, 1, 3}, {0, 1, 2, 3, 4}, {}}
	for _, rowDims := range [][]int{{}, {3}, {2, 2}} {
		t.Run(fmt.Sprintf("rows of %v", rowDims), func(t *testing.T) {
			rowSize := 1
			for _, d := range rowDims {
				rowSize *= d
			}
			dims := append([]int{n}, rowDims...)
			f32, f32Data := numbered[float32](0, dims...)
			i32, i32Data := numbered[int32](1000, dims...)
			f64, f64Data := numbered[float64](-50, n)
			i64, i64Data := numbered[int64](7, n, 1)
			src, err := prepare.TensorSource([]*tensors.Tensor{f32, i32}, []*tensors.Tensor{f64, i64})
			require.NoError(t, err)
			assert.Equal(t, n, src.Len())
			for _, indices := range indicesCases {
				inputs, labels, err := src.Batch(indices)
				require.NoError(t, err, "%v", indices)
				require.Len(t, inputs, 2)
				require.Len(t, labels, 2)
				wantDims := append([]int{len(indices)}, rowDims...)
				assert.Equal(t, wantDims, inputs[0].Shape().Dimensions)
				assert.Equal(t, wantDims, inputs[1].Shape().Dimensions)
				assert.Equal(t, dtypes.Float32, inputs[0].DType())
				assert.Equal(t, dtypes.Int32, inputs[1].DType())
				assert.Equal(t, []int{len(indices)}, labels[0].Shape().Dimensions)
				assert.Equal(t, []int{len(indices), 1}, labels[1].Shape().Dimensions)
				assertRows(t, wantRows(f32Data, rowSize, indices), tensors.MustCopyFlatData[float32](inputs[0]), indices)
				assertRows(t, wantRows(i32Data, rowSize, indices), tensors.MustCopyFlatData[int32](inputs[1]), indices)
				assertRows(t, wantRows(f64Data, 1, indices), tensors.MustCopyFlatData[float64](labels[0]), indices)
				assertRows(t, wantRows(i64Data, 1, indices), tensors.MustCopyFlatData[int64](labels[1]), indices)
			}
			// The source's tensors are not modified by gathering.
			assert.Equal(t, f32Data, tensors.MustCopyFlatData[float32](f32))
		})
	}
}

func TestTensorSourceBatchIsACopy(t *testing.T) {
	x, _ := numbered[float32](0, 3, 2)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, nil)
	require.NoError(t, err)
	inputs, labels, err := src.Batch([]int{1})
	require.NoError(t, err)
	assert.Empty(t, labels, "no label tensors")
	require.NoError(t, inputs[0].MutableFlatData(func(flat any) { flat.([]float32)[0] = -1 }))
	again, _, err := src.Batch([]int{1})
	require.NoError(t, err)
	assert.Equal(t, []float32{2, 3}, tensors.MustCopyFlatData[float32](again[0]), "a batch must not alias the source")
}

func TestTensorSourceBadIndex(t *testing.T) {
	x, _ := numbered[float32](0, 3, 2)
	y, _ := numbered[int32](0, 3)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	require.NoError(t, err)
	for _, indices := range [][]int{{3}, {0, 7}, {-1}, {1, 2, 3}} {
		_, _, err := src.Batch(indices)
		require.Error(t, err, "%v", indices)
		assert.Contains(t, err.Error(), "outside [0, 3)")
	}
}

func TestTensorSourceErrors(t *testing.T) {
	x5, _ := numbered[float32](0, 5, 2)
	y5, _ := numbered[int32](0, 5)
	y4, _ := numbered[int32](0, 4)
	z6, _ := numbered[float32](0, 6, 1, 1)
	scalar := tensors.FromValue(float32(3))
	tests := []struct {
		name           string
		inputs, labels []*tensors.Tensor
		wantContains   []string
	}{
		{name: "label count differs", inputs: []*tensors.Tensor{x5}, labels: []*tensors.Tensor{y4},
			wantContains: []string{"tensor #1 has 4 examples", "tensor #0 has 5"}},
		{name: "second input differs", inputs: []*tensors.Tensor{x5, z6}, labels: []*tensors.Tensor{y5},
			wantContains: []string{"tensor #1 has 6 examples", "tensor #0 has 5"}},
		{name: "scalar input", inputs: []*tensors.Tensor{scalar}, wantContains: []string{"tensor #0 is a scalar"}},
		{name: "scalar label", inputs: []*tensors.Tensor{x5}, labels: []*tensors.Tensor{y5, scalar},
			wantContains: []string{"tensor #2 is a scalar"}},
		{name: "nil tensor", inputs: []*tensors.Tensor{x5, nil}, wantContains: []string{"tensor #1 is nil"}},
		{name: "no inputs", labels: []*tensors.Tensor{y5}, wantContains: []string{"at least one input"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src, err := prepare.TensorSource(tc.inputs, tc.labels)
			require.Error(t, err)
			assert.Nil(t, src)
			for _, s := range tc.wantContains {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}

// TestTensorSourceNoExamples: a source of zero examples is valid (the data loader rejects it) and gathers
// empty batches; any index is out of range.
func TestTensorSourceNoExamples(t *testing.T) {
	x := tensors.FromFlatDataAndDimensions([]float32{}, 0, 3)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, nil)
	require.NoError(t, err)
	assert.Zero(t, src.Len())
	inputs, _, err := src.Batch(nil)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 3}, inputs[0].Shape().Dimensions)
	_, _, err = src.Batch([]int{0})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "outside [0, 0)")
}

// TestSparseLabelsAreChecked: with SparseLabels, a label outside the classes is an error naming the
// example and the value (a sparse cross-entropy would silently give it a loss of 0).
func TestSparseLabelsAreChecked(t *testing.T) {
	inputs := tensors.FromValue([][]float32{{1}, {2}, {3}})
	for _, tc := range []struct {
		name   string
		labels *tensors.Tensor
		want   string
	}{
		{"in range", tensors.FromValue([][]int32{{0}, {9}, {3}}), ""},
		{"too large", tensors.FromValue([][]int32{{0}, {12}, {3}}), "labels #0 of example 1 is 12, not a class in [0, 10)"},
		{"negative", tensors.FromValue([]int64{0, 1, -1}), "labels #0 of example 2 is -1, not a class in [0, 10)"},
		{"uint8", tensors.FromValue([]uint8{10, 1, 2}), "labels #0 of example 0 is 10"},
		{"float labels", tensors.FromValue([]float32{0, 1, 2}), "labels #0: class labels must be integers, got Float32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := prepare.TensorSource([]*tensors.Tensor{inputs}, []*tensors.Tensor{tc.labels}, prepare.SparseLabels(10))
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := prepare.TensorSource([]*tensors.Tensor{inputs}, []*tensors.Tensor{tensors.FromValue([]int32{0, 1, 99})})
	require.NoError(t, err, "without SparseLabels labels are not interpreted")
}
