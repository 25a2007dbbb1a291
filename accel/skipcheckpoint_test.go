package accel_test

import (
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// evaluateWith prepares an evaluation loader inside the evaluation, as the demo does, and runs it.
func evaluateWith(t *testing.T, acc *accel.Accelerator, r resumable, opts ...prepare.LoaderOption) {
	x, y := testmodel.Data(6, 8)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	require.NoError(t, err)
	eval, err := acc.PrepareDataLoader(src, append([]prepare.LoaderOption{prepare.BatchSize(3)}, opts...)...)
	require.NoError(t, err)
	for batch, err := range eval.All() {
		require.NoError(t, err)
		_, err = r.model.Predict(batch.Inputs...)
		require.NoError(t, err)
	}
}

// TestSkipCheckpointLoader: a run that prepares its evaluation loader inside the evaluation and saves
// afterwards resumes in a run that has not evaluated yet when the loader is prepared with SkipCheckpoint —
// to the same weights as the saved run — and is refused, with the fix in the message, when it is not.
func TestSkipCheckpointLoader(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []prepare.LoaderOption
		wantErr string
	}{
		{"skip checkpoint", []prepare.LoaderOption{prepare.SkipCheckpoint()}, ""},
		{"checkpointed", nil, "saved 1 optimizer(s) and 2 loader(s); this run prepared 1 and 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			acc := newSingle(t, accel.WithGradientAccumulationSteps(2))
			saved := prepareResumable(t, acc, 16, 2, 1)
			_, err := saved.train(acc, 1, 3)
			require.NoError(t, err)
			evaluateWith(t, acc, saved, tc.opts...)
			_, err = acc.SaveState(dir)
			require.NoError(t, err)
			want, err := replicas.VariablesDigest(saved.model.ReplicatedVariables())
			require.NoError(t, err)

			resumed := newSingle(t, accel.WithGradientAccumulationSteps(2))
			r := prepareResumable(t, resumed, 16, 2, 1)
			err = resumed.LoadState(dir)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.Contains(t, err.Error(), "prepare.SkipCheckpoint()")
				return
			}
			require.NoError(t, err)
			got, err := replicas.VariablesDigest(r.model.ReplicatedVariables())
			require.NoError(t, err)
			assert.Equal(t, want, got)
			assert.Equal(t, saved.loader.Position(), r.loader.Position())
			evaluateWith(t, resumed, r, tc.opts...) // evaluating after the resume, as the saved run did
		})
	}
}
