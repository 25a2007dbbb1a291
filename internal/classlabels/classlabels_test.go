package classlabels

import (
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestInt64s(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    *tensors.Tensor
		want []int64
	}{
		{"int32 column", tensors.FromValue([][]int32{{2}, {0}}), []int64{2, 0}},
		{"int64", tensors.FromValue([]int64{-1, 7}), []int64{-1, 7}},
		{"uint8", tensors.FromValue([]uint8{255, 1}), []int64{255, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Int64s(tc.t)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := Int64s(tensors.FromValue([]float32{1}))
	assert.ErrorContains(t, err, "class labels must be integers, got Float32")
}
