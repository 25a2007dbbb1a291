package accel_test

import (
	"fmt"
	"io"
	"sync"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/train"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
)

// queue stands for a stream only one process can read: it hands out n batches of two examples.
type queue struct{ n, next int }

func (q *queue) Name() string { return "queue" }
func (q *queue) Reset()       { q.next = 0 }
func (q *queue) Yield() (any, []*tensors.Tensor, []*tensors.Tensor, error) {
	if q.next == q.n {
		return nil, nil, nil, io.EOF
	}
	q.next++
	k := int32(q.next - 1)
	return nil, []*tensors.Tensor{tensors.FromFlatDataAndDimensions([]int32{k, k}, 2)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions([]int32{k, k}, 2, 1)}, nil
}

// The main process reads the queue; the other gets its batches from it. Here two processes are goroutines
// of one program (under mpirun each runs the same loop, with the queue opened on the main process only).
func ExampleDispatchBatches() {
	comms, err := backends.NewInProcessGroup(2)
	if err != nil {
		fmt.Println(err)
		return
	}
	got := make([][]int32, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Go(func() {
			acc, err := accel.New(accel.WithCommunicator(comms[rank]), accel.WithBackend("go"))
			if err != nil {
				fmt.Println(err)
				return
			}
			defer acc.Close()
			var ds train.Dataset
			if acc.IsMainProcess() {
				ds = &queue{n: 4}
			}
			loader, err := acc.PrepareDataset(ds, accel.DispatchBatches())
			if err != nil {
				fmt.Println(err)
				return
			}
			for batch, err := range loader.All() {
				if err != nil {
					fmt.Println(err)
					return
				}
				got[rank] = append(got[rank], tensors.MustCopyFlatData[int32](batch.Inputs[0])[0])
			}
		})
	}
	wg.Wait()
	fmt.Println("process 0 trains on batches", got[0])
	fmt.Println("process 1 trains on batches", got[1])
	// Output:
	// process 0 trains on batches [0 2]
	// process 1 trains on batches [1 3]
}

// The function prepares what depends on the batch size and trains; here it stands for a model that does not
// fit more than 100 examples per process. The search halves from 1000 and reports the size that ran.
func ExampleFindExecutableBatchSize() {
	acc, err := accel.New(accel.WithBackend("go"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer acc.Close()
	size, err := accel.FindExecutableBatchSize(acc, 1000, func(batchSize int) error {
		if batchSize > 100 {
			return fmt.Errorf("batch of %d: %w", batchSize, accel.ErrOutOfMemory)
		}
		return nil // prepare the model, the optimizer and a loader of batchSize, and train
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("training with", size, "examples per process")
	// Output:
	// goaccel: batch size 62 per process fits (refused for memory: 1000, 500, 250, 125)
	// training with 62 examples per process
}
