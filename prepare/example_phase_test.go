package prepare_test

import (
	"fmt"
	"io"
	"time"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/prepare"
)

// A phase observer hears of each phase as it ends: two micro-batches of an accumulation cycle (the
// second syncs), each with its compiled forward and backward pass inside, then the optimizer step.
func ExampleRuntime_SetPhaseObserver() {
	backend, _ := cpu.New(cpu.Config{Backend: cpu.PureGo})
	state, _ := accumulate.NewGradientState(2, false)
	rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
	rt.SetPhaseObserver(func(p prepare.Phase, begin, end time.Time) {
		fmt.Printf("%s (syncs: %v); the runtime is back in %q\n", p, p.Syncs, rt.Phase())
	})
	model, _ := prepare.NewModel(rt, context.New(), weightsOnly, losses.MeanSquaredError)
	opt, _ := prepare.NewOptimizer(model, optimizers.StochasticGradientDescent())
	for range 2 {
		_ = state.Accumulate(func() error {
			if _, err := model.Backward(exampleBatch, state.MicroBatchScale()); err != nil {
				return err
			}
			_, err := opt.Step()
			return err
		})
	}
	// Output:
	// the forward and backward pass of micro-batch 1 (syncs: false); the runtime is back in "backward of micro-batch 1"
	// backward of micro-batch 1 (syncs: false); the runtime is back in ""
	// the forward and backward pass of micro-batch 2 (syncs: true); the runtime is back in "backward of micro-batch 2"
	// backward of micro-batch 2 (syncs: true); the runtime is back in ""
	// optimizer step 1 (syncs: false); the runtime is back in ""
}

// ObserveSource times the batches a loader draws from a source; the batches themselves are the source's.
// Prefetching is off here so that each load prints before its batch: by default the loader reads the next
// batch on another goroutine while the loop works on the current one, and the two lines interleave as
// the goroutines run.
func ExampleRuntime_ObserveSource() {
	backend, _ := cpu.New(cpu.Config{Backend: cpu.PureGo})
	state, _ := accumulate.NewGradientState(1, false)
	rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
	rt.SetPhaseObserver(func(p prepare.Phase, begin, end time.Time) { fmt.Println(p) })
	x := tensors.FromValue([][]float32{{1}, {2}, {3}, {4}, {5}})
	src, _ := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{x})
	loader, _ := prepare.NewDataLoader(rt, rt.ObserveSource(src), prepare.BatchSize(2), prepare.Prefetch(false))
	for batch, err := range loader.All() {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("batch", batch.Indices)
	}
	// Output:
	// loading a batch of 2 examples
	// batch [0 1]
	// loading a batch of 2 examples
	// batch [2 3]
	// loading a batch of 1 examples
	// batch [4]
}

// A stream loader's batches are timed as they are read, as a source's are through ObserveSource (the
// loader reads one round ahead, to know which batch is the epoch's last).
func ExampleRuntime_SetPhaseObserver_stream() {
	backend, _ := cpu.New(cpu.Config{Backend: cpu.PureGo})
	state, _ := accumulate.NewGradientState(1, false)
	rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
	rt.SetPhaseObserver(func(p prepare.Phase, begin, end time.Time) { fmt.Println(p) })
	x := tensors.FromValue([][]float32{{1}, {2}, {3}})
	loader, _ := prepare.NewStreamLoader(rt, &streamOf{batch: x, n: 2})
	for batch, err := range loader.All() {
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("batch of", batch.Size())
	}
	// Output:
	// loading a batch of 3 examples
	// loading a batch of 3 examples
	// batch of 3
	// batch of 3
}

// streamOf yields batch n times.
type streamOf struct {
	batch *tensors.Tensor
	n, i  int
}

func (s *streamOf) Name() string { return "stream" }
func (s *streamOf) Reset()       { s.i = 0 }
func (s *streamOf) Yield() (any, []*tensors.Tensor, []*tensors.Tensor, error) {
	if s.i == s.n {
		return nil, nil, nil, io.EOF
	}
	s.i++
	return nil, []*tensors.Tensor{s.batch}, []*tensors.Tensor{s.batch}, nil
}
