package prepare_test

import (
	"fmt"
	"io"
	"sync"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/train"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/prepare"
)

// countingStream yields n batches of one example each, whose value is the batch's number.
type countingStream struct{ n, next int }

func (s *countingStream) Name() string { return "counting" }
func (s *countingStream) Reset()       { s.next = 0 }
func (s *countingStream) Yield() (any, []*tensors.Tensor, []*tensors.Tensor, error) {
	if s.next == s.n {
		return nil, nil, nil, io.EOF
	}
	s.next++
	return nil, []*tensors.Tensor{tensors.FromFlatDataAndDimensions([]float32{float32(s.next - 1)}, 1)}, nil, nil
}

// Five stream batches on three ranks, read by rank 0 alone: each round of three goes to the three ranks, and
// the last round, of two, pads rank 2 with the round's first batch (Valid 0). All ranks end together.
func ExampleDispatch() {
	backend, err := cpu.New(cpu.Config{Backend: "go"})
	if err != nil {
		fmt.Println(err)
		return
	}
	comms, err := backends.NewInProcessGroup(3)
	if err != nil {
		fmt.Println(err)
		return
	}
	got := make([]string, 3)
	var wg sync.WaitGroup
	for rank, comm := range comms {
		wg.Go(func() { // the ranks talk: each on its own goroutine, as each in its own process
			state, _ := accumulate.NewGradientState(1, false)
			rt := &prepare.Runtime{Backend: backend, Comm: comm, State: state}
			var stream train.Dataset // only rank 0 has the stream
			if rank == 0 {
				stream = &countingStream{n: 5}
			}
			loader, err := prepare.NewStreamLoader(rt, stream, prepare.Dispatch())
			if err != nil {
				got[rank] = err.Error()
				return
			}
			for batch, err := range loader.All() {
				if err != nil {
					got[rank] += err.Error()
					return
				}
				got[rank] += fmt.Sprintf(" %v (valid %d)", tensors.MustCopyFlatData[float32](batch.Inputs[0]), batch.Valid)
			}
		})
	}
	wg.Wait()
	for rank, batches := range got {
		fmt.Printf("rank %d:%s\n", rank, batches)
	}
	// Output:
	// rank 0: [0] (valid 1) [3] (valid 1)
	// rank 1: [1] (valid 1) [4] (valid 1)
	// rank 2: [2] (valid 1) [3] (valid 0)
}
