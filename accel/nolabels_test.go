package accel_test

import (
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// TestBackwardWithoutLabelsSaysSo: a batch without labels, handed to a loss that reads them, is an error
// that says the labels are missing; before, it read "index out of range [0] with length 0".
func TestBackwardWithoutLabelsSaysSo(t *testing.T) {
	acc := newSingle(t)
	inputs, _ := testmodel.Data(8, 1)
	model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
	require.NoError(t, err)
	_, err = acc.Backward(model, accel.Batch{Inputs: []*tensors.Tensor{inputs}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the batch has no labels")
}
