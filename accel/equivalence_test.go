package accel_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// runRanks runs fn on n goroutine ranks of an in-process group, each with its own Accelerator.
func runRanks(t *testing.T, n int, opts []accel.Option, fn func(rank int, acc *accel.Accelerator) error) {
	t.Helper()
	comms, err := backends.NewInProcessGroup(n)
	require.NoError(t, err)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			acc, err := accel.New(append([]accel.Option{accel.WithCommunicator(comms[r]), accel.WithBackend("go")}, opts...)...)
			if err != nil {
				errs[r] = err
				comms[r].Abort(1)
				return
			}
			defer acc.Close()
			if errs[r] = fn(r, acc); errs[r] != nil {
				comms[r].Abort(1) // release the other ranks from any collective they wait in
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// TestEquivalence: N ranks × K micro-batches × b examples per optimizer step give the same weights as
// GoMLX's own trainer taking one step per N·K·b batch (docs/semantics.md §2).
func TestEquivalence(t *testing.T) {
	const b, steps = 4, 3
	for _, tc := range []struct {
		ranks, k int
		kind     testmodel.OptimizerKind
		manual   bool
	}{
		{1, 4, testmodel.SGD, false},
		{1, 4, testmodel.Adam, false},
		{1, 4, testmodel.SGD, true},
		{1, 4, testmodel.Adam, true},
		{2, 1, testmodel.SGD, false},
		{2, 3, testmodel.Adam, false},
		{4, 3, testmodel.SGD, false},
		{4, 1, testmodel.Adam, false},
	} {
		name := fmt.Sprintf("ranks=%d/K=%d/%s/manual=%v", tc.ranks, tc.k, tc.kind, tc.manual)
		t.Run(name, func(t *testing.T) {
			global := tc.ranks * tc.k * b
			inputs, labels := testmodel.Data(global*steps, 1)
			run := testmodel.Run{Kind: tc.kind, Inputs: inputs, Labels: labels, BatchSize: b}
			opts := []accel.Option{accel.WithGradientAccumulationSteps(tc.k)}
			if tc.manual {
				run.ManualK, opts = tc.k, nil
			}
			results := make([]testmodel.Result, tc.ranks)
			runRanks(t, tc.ranks, opts, func(rank int, acc *accel.Accelerator) error {
				var err error
				results[rank], err = run.Train(acc)
				return err
			})
			require.EqualValues(t, steps, results[0].Steps)

			// Controls, so the comparison below cannot pass vacuously: training moved the weights, and a
			// reference on the wrong grouping (one process taking K·b-sized steps) disagrees.
			moved, _, err := testmodel.MaxRelativeError(results[0].Model.Parameters(), results[0].Initial)
			require.NoError(t, err)
			require.Greater(t, moved, 1e-3, "training did not move the weights")

			// The reference is GoMLX's trainer, from the weights our run started with, on N·K·b batches.
			backend, err := cpu.New(cpu.Config{Backend: "go"})
			require.NoError(t, err)
			wrong, err := results[0].Initial.Clone()
			require.NoError(t, err)
			require.NoError(t, testmodel.ReferenceTrain(backend, wrong, tc.kind,
				testmodel.ReferenceBatches(inputs, labels, b, 1)[:steps]))
			off, _, err := testmodel.MaxRelativeError(results[0].Model.Parameters(), wrong)
			require.NoError(t, err)
			require.Greater(t, off, 1e-4, "a differently batched reference should not match")

			ref := results[0].Initial
			require.NoError(t, testmodel.ReferenceTrain(backend, ref, tc.kind,
				testmodel.ReferenceBatches(inputs, labels, global, 1)))
			for r := range tc.ranks {
				worst, name, err := testmodel.MaxRelativeError(results[r].Model.Parameters(), ref)
				require.NoError(t, err)
				assert.LessOrEqual(t, worst, 1e-5, "rank %d: variable %s", r, name)
			}
		})
	}
}
