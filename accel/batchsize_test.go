package accel_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// activationHeavyMLP is testmodel's MLP with a wide hidden layer: its activations, which grow with the batch, dwarf
// its parameters, as a memory-bound model's do.
func activationHeavyMLP(ctx *context.Context, inputs []*Node) []*Node {
	h := Tanh(layers.Dense(ctx.In("hidden"), inputs[0], true, 256))
	return []*Node{layers.Dense(ctx.In("output"), h, true, testmodel.Classes)}
}

const searchStart = 4096

// trainAt is the function a program gives FindExecutableBatchSize: it prepares the model, the optimizer and
// a loader with the batch size, and trains one step. It records the sizes it was called with.
func trainAt(acc *accel.Accelerator, calls *[]int) func(int) error {
	inputs, labels := testmodel.Data(searchStart, 5)
	return func(batchSize int) error {
		*calls = append(*calls, batchSize)
		model, err := acc.PrepareModel(context.New(), activationHeavyMLP, testmodel.Loss)
		if err != nil {
			return err
		}
		opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.Adam))
		if err != nil {
			return err
		}
		src, err := accel.TensorSource([]*tensors.Tensor{inputs}, []*tensors.Tensor{labels})
		if err != nil {
			return err
		}
		loader, err := acc.PrepareDataLoader(src, accel.BatchSize(batchSize))
		if err != nil {
			return err
		}
		for batch, err := range loader.All() {
			if err != nil {
				return err
			}
			return acc.Accumulate(func() error {
				if _, err := acc.Backward(model, batch); err != nil {
					return err
				}
				if _, err := opt.Step(); err != nil {
					return err
				}
				return opt.ZeroGrad()
			})
		}
		return nil
	}
}

// estimateAt returns the refusal of the wide MLP at searchStart examples under a limit of one byte: the
// estimate the tests size their limits from.
func estimateAt(t *testing.T) *accel.MemoryError {
	t.Helper()
	acc, err := accel.New(accel.WithBackend("go"), accel.WithMemoryLimit(1), accel.WithOutput(new(bytes.Buffer)))
	require.NoError(t, err)
	defer acc.Close()
	var calls []int
	_, err = accel.FindExecutableBatchSize(acc, searchStart, trainAt(acc, &calls))
	require.ErrorIs(t, err, accel.ErrOutOfMemory)
	assert.Equal(t, []int{searchStart}, calls, "nothing fits a byte: the estimate says so after one refusal")
	var refusal *accel.MemoryError
	require.ErrorAs(t, err, &refusal)
	require.Equal(t, searchStart, refusal.Batch)
	require.Greater(t, refusal.Activations, 100*refusal.State, "the activations must dominate for the test to mean anything")
	return refusal
}

// limitFor is a memory limit that a batch of target examples fits and twice as many does not.
func limitFor(e *accel.MemoryError, target int) int64 {
	return int64(e.State + 1.5*e.Activations*float64(target)/float64(e.Batch))
}

// TestFindExecutableBatchSizeHalvesToFit: a model whose estimate at 4096 examples exceeds the memory limit
// is refused there without running; the search goes straight to the largest half the estimate leaves room
// for (512), skipping 2048 and 1024 without calling the function, and trains at it. The accelerator keeps
// only the objects of the attempt that ran, and the main process says what it found.
func TestFindExecutableBatchSizeHalvesToFit(t *testing.T) {
	limit := limitFor(estimateAt(t), 512)
	var out bytes.Buffer
	acc, err := accel.New(accel.WithBackend("go"), accel.WithMemoryLimit(limit), accel.WithOutput(&out))
	require.NoError(t, err)
	defer acc.Close()
	var calls []int
	size, err := accel.FindExecutableBatchSize(acc, searchStart, trainAt(acc, &calls))
	require.NoError(t, err)
	assert.Equal(t, 512, size)
	assert.Equal(t, []int{searchStart, 512}, calls)
	assert.Equal(t, "goaccel: batch size 512 per process fits (refused for memory: 4096; skipped by the memory "+
		"estimate: 2048, 1024)\n", out.String())
	assert.EqualValues(t, 1, acc.Stats().OptimizerSteps, "the attempt that fit trained")
	_, err = acc.SaveState(t.TempDir())
	require.NoError(t, err, "a checkpoint holds the one model, optimizer and loader that ran")
}

// TestFindExecutableBatchSizeRanksAgree: two processes with different memory use the same size, the one
// that fits the smaller: process 0 has the machine's memory and would build the model at 4096, process 1's
// limit fits 256. Both refuse 4096 together — process 0 alone going on would wait in Materialize's next
// collective for a process that gave up — and both train at 256.
func TestFindExecutableBatchSizeRanksAgree(t *testing.T) {
	estimate := estimateAt(t)
	limits := []int64{0, limitFor(estimate, 256)}
	comms, err := backends.NewInProcessGroup(2)
	require.NoError(t, err)
	sizes, calls, errs := make([]int, 2), make([][]int, 2), make([]error, 2)
	var out bytes.Buffer
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			acc, err := accel.New(accel.WithCommunicator(comms[r]), accel.WithBackend("go"),
				accel.WithMemoryLimit(limits[r]), accel.WithOutput(&out))
			if err != nil {
				errs[r] = err
				comms[r].Abort(1)
				return
			}
			defer acc.Close()
			sizes[r], errs[r] = accel.FindExecutableBatchSize(acc, searchStart, trainAt(acc, &calls[r]))
			if errs[r] != nil {
				comms[r].Abort(1)
			}
		})
	}
	wg.Wait()
	for r := range 2 {
		require.NoError(t, errs[r], "process %d", r)
		assert.Equal(t, 256, sizes[r], "process %d", r)
		assert.Equal(t, []int{searchStart, 256}, calls[r], "process %d: both refused 4096 together", r)
	}
	assert.Contains(t, out.String(), "goaccel: batch size 256 per process fits")
	assert.Equal(t, 1, bytes.Count(out.Bytes(), []byte("\n")), "one line, from the main process")
}

// TestFindExecutableBatchSizeOtherErrors: an error that is not about memory ends the search at once, on
// every process: the one that failed returns its error, the others say which process failed.
func TestFindExecutableBatchSizeOtherErrors(t *testing.T) {
	boom := errors.New("boom")
	t.Run("one process", func(t *testing.T) {
		acc, err := accel.New(accel.WithBackend("go"))
		require.NoError(t, err)
		defer acc.Close()
		calls := 0
		_, err = accel.FindExecutableBatchSize(acc, 64, func(int) error { calls++; return boom })
		require.ErrorIs(t, err, boom)
		assert.Equal(t, 1, calls, "no retry")
	})
	t.Run("two processes", func(t *testing.T) {
		errs := make([]error, 2)
		calls := make([]int, 2)
		runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
			_, errs[rank] = accel.FindExecutableBatchSize(acc, 64, func(int) error {
				calls[rank]++
				if rank == 1 {
					return fmt.Errorf("reading the data: %w", boom)
				}
				return nil
			})
			return nil
		})
		assert.ErrorIs(t, errs[1], boom)
		require.Error(t, errs[0])
		assert.Contains(t, errs[0].Error(), "process 1 failed at batch size 64")
		assert.Equal(t, []int{1, 1}, calls)
	})
	t.Run("arguments", func(t *testing.T) {
		acc, err := accel.New(accel.WithBackend("go"))
		require.NoError(t, err)
		defer acc.Close()
		_, err = accel.FindExecutableBatchSize(acc, 0, func(int) error { return nil })
		require.ErrorContains(t, err, "at least 1")
		_, err = accel.FindExecutableBatchSize(acc, 8, nil)
		require.ErrorContains(t, err, "nil")
	})
}

// TestFindExecutableBatchSizeWithoutEstimate: a refusal that carries no estimate (a function's own
// ErrOutOfMemory) halves one size at a time, down to 1 and no further.
func TestFindExecutableBatchSizeWithoutEstimate(t *testing.T) {
	acc, err := accel.New(accel.WithBackend("go"), accel.WithOutput(new(bytes.Buffer)))
	require.NoError(t, err)
	defer acc.Close()
	var calls []int
	size, err := accel.FindExecutableBatchSize(acc, 100, func(b int) error {
		calls = append(calls, b)
		if b > 20 {
			return fmt.Errorf("the device: %w", accel.ErrOutOfMemory)
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 12, size)
	assert.Equal(t, []int{100, 50, 25, 12}, calls)

	calls = nil
	_, err = accel.FindExecutableBatchSize(acc, 5, func(b int) error {
		calls = append(calls, b)
		return accel.ErrOutOfMemory
	})
	require.ErrorIs(t, err, accel.ErrOutOfMemory)
	assert.Contains(t, err.Error(), "no batch size from 5 down to 1 fits")
	assert.Equal(t, []int{5, 2, 1}, calls)
}
