package accel_test

import (
	"errors"
	"math"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// TestFP16OverflowIsRefused: with gradients sent as fp16, a synced gradient past ±65504 is Inf. By default
// the step is refused, naming fp16's range, and the weights stay finite; before, the weights turned NaN and
// the job ended with exit code 0. A program that asks for NonFiniteApply still gets GoMLX's behaviour, and
// bf16, which has float32's range, carries the same gradients.
func TestFP16OverflowIsRefused(t *testing.T) {
	inputs, labels := testmodel.Data(16, 1)
	for _, tc := range []struct {
		name        string
		format      accel.Compression
		policy      []accel.OptimizerOption
		wantRefused bool
		wantFinite  bool
	}{
		{"fp16, default policy", accel.FP16, nil, true, true},
		{"fp16, the program applies non-finite steps", accel.FP16, []accel.OptimizerOption{accel.OnNonFinite(accel.NonFiniteApply)}, false, false},
		{"bf16 has float32's range", accel.BF16, nil, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runRanks(t, 2, []accel.Option{accel.WithGradientCompression(tc.format)}, func(rank int, acc *accel.Accelerator) error {
				model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
				require.NoError(t, err)
				opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.SGD), tc.policy...)
				require.NoError(t, err)
				batch := accel.Batch{Inputs: []*tensors.Tensor{testmodel.Rows(inputs, rank*8, rank*8+8)},
					Labels: []*tensors.Tensor{testmodel.Rows(labels, rank*8, rank*8+8)}}
				// A loss scaled by 1e8 makes gradients far past fp16's largest value, 65504, and far inside
				// float32's (and bfloat16's) range.
				if _, err := acc.Backward(model, batch, accel.LossScale(1e8)); err != nil {
					return err
				}
				_, err = opt.Step()
				var refused *accel.NonFiniteError
				if tc.wantRefused {
					require.True(t, errors.As(err, &refused), "want a refused step, got %v", err)
					assert.True(t, refused.FP16)
					assert.Contains(t, err.Error(), "65504")
				} else {
					require.NoError(t, err)
				}
				finite := true
				for _, v := range model.ReplicatedVariables() {
					values, err := testmodel.FlatFloat64(v)
					require.NoError(t, err)
					for _, x := range values {
						finite = finite && !math.IsNaN(x) && !math.IsInf(x, 0)
					}
				}
				assert.Equal(t, tc.wantFinite, finite, "rank %d: weights finite", rank)
				return nil
			})
		})
	}
}
