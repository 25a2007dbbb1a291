package prepare_test

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	_ "github.com/goaccel/goaccel/cpu/kernels" // goaccel's kernels, as accel links them
	"github.com/goaccel/goaccel/prepare"
)

// Ten examples on three ranks, batch size 2, shuffled with a fixed seed. Every rank computes the same
// permutation of the epoch and takes every third example of it; the ten examples do not split evenly, so
// the last round wraps around to the permutation's start, and Valid tells which examples are real.
func ExampleDataLoader() {
	backend, err := cpu.New(cpu.Config{Backend: "go"})
	if err != nil {
		fmt.Println(err)
		return
	}
	values := make([]float32, 10)
	for i := range values {
		values[i] = float32(i)
	}
	source, err := prepare.TensorSource([]*tensors.Tensor{tensors.FromFlatDataAndDimensions(values, 10)}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	comms, err := backends.NewInProcessGroup(3) // one Communicator per rank; here all in one goroutine
	if err != nil {
		fmt.Println(err)
		return
	}
	for rank, comm := range comms {
		state, _ := accumulate.NewGradientState(1, false)
		rt := &prepare.Runtime{Backend: backend, Comm: comm, State: state}
		loader, err := prepare.NewDataLoader(rt, source, prepare.BatchSize(2), prepare.Shuffle(), prepare.Seed(42))
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("rank %d:", rank)
		for batch, err := range loader.All() {
			if err != nil {
				fmt.Println(err)
				return
			}
			fmt.Printf(" %v (valid %d)", batch.Indices, batch.Valid)
		}
		fmt.Println()
	}
	// Output:
	// rank 0: [3 6] (valid 2) [0 8] (valid 2)
	// rank 1: [2 4] (valid 2) [7 3] (valid 1)
	// rank 2: [5 1] (valid 2) [9 2] (valid 1)
}

// With SplitBatches the batch size is global: two ranks with BatchSize(4) each take 2 examples per step,
// and every step covers the same 4 examples a single process would.
func ExampleSplitBatches() {
	backend, _ := cpu.New(cpu.Config{Backend: "go"})
	values := make([]float32, 8)
	source, _ := prepare.TensorSource([]*tensors.Tensor{tensors.FromFlatDataAndDimensions(values, 8)}, nil)
	comms, _ := backends.NewInProcessGroup(2)
	for rank, comm := range comms {
		state, _ := accumulate.NewGradientState(1, false)
		rt := &prepare.Runtime{Backend: backend, Comm: comm, State: state}
		loader, err := prepare.NewDataLoader(rt, source, prepare.BatchSize(4), prepare.SplitBatches())
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("rank %d, %d per batch:", rank, loader.BatchSize())
		for batch := range loader.All() {
			fmt.Printf(" %v", batch.Indices)
		}
		fmt.Println()
	}
	// Output:
	// rank 0, 2 per batch: [0 2] [4 6]
	// rank 1, 2 per batch: [1 3] [5 7]
}

// SkipCheckpoint leaves a loader out of checkpoints, for an evaluation loader prepared inside an evaluate
// function: a resumed run that has not evaluated yet then matches the saved one.
func ExampleSkipCheckpoint() {
	backend, _ := cpu.New(cpu.Config{Backend: "go"})
	source, _ := prepare.TensorSource([]*tensors.Tensor{tensors.FromFlatDataAndDimensions(make([]float32, 4), 4)}, nil)
	state, _ := accumulate.NewGradientState(1, false)
	rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
	train, _ := prepare.NewDataLoader(rt, source, prepare.BatchSize(2))
	eval, _ := prepare.NewDataLoader(rt, source, prepare.BatchSize(2), prepare.SkipCheckpoint())
	fmt.Println("train checkpointed:", train.Checkpointed(), "eval checkpointed:", eval.Checkpointed())
	// Output:
	// train checkpointed: true eval checkpointed: false
}

// A loader's State is its place in the data, the examples of the epoch's order consumed; Restore on a fresh
// loader resumes there: the next iteration yields the rest of that epoch, skipping the consumed examples
// without computing them.
func ExampleDataLoader_Restore() {
	backend, err := cpu.New(cpu.Config{Backend: "go"})
	if err != nil {
		fmt.Println(err)
		return
	}
	values := []float32{0, 1, 2, 3, 4, 5}
	source, err := prepare.TensorSource([]*tensors.Tensor{tensors.FromFlatDataAndDimensions(values, 6)}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	newLoader := func() *prepare.DataLoader {
		state, _ := accumulate.NewGradientState(1, false)
		rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
		loader, err := prepare.NewDataLoader(rt, source, prepare.BatchSize(2))
		if err != nil {
			panic(err)
		}
		return loader
	}
	first := newLoader()
	for range first.All() {
		break // one batch consumed
	}
	saved := first.State()
	fmt.Printf("saved: %+v\n", saved)
	resumed := newLoader()
	if err := resumed.Restore(saved); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Print("resumed:")
	for batch := range resumed.All() {
		fmt.Print(" ", batch.Indices)
	}
	fmt.Println()
	fmt.Println(resumed.Restore(prepare.LoaderState{Epoch: 0, Consumed: 9}) != nil)
	// Output:
	// saved: {Epoch:0 Consumed:2}
	// resumed: [2 3] [4 5]
	// true
}

// A loader's place is global: what 2 processes consumed is the head of the epoch's order, so 3 processes
// restored there take the rest, each rank r' the positions Consumed + r', Consumed + r' + 3, …, padded
// from the start of the epoch (even batches) so that every rank has as many batches. A per-process batch
// count, as older checkpoints recorded, reads as the same place through StateAfterBatches.
func ExampleDataLoader_StateAfterBatches() {
	backend, err := cpu.New(cpu.Config{Backend: "go"})
	if err != nil {
		fmt.Println(err)
		return
	}
	values := make([]float32, 12)
	for i := range values {
		values[i] = float32(i)
	}
	source, _ := prepare.TensorSource([]*tensors.Tensor{tensors.FromFlatDataAndDimensions(values, 12)}, nil)
	loaders := func(ranks int) []*prepare.DataLoader {
		comms, _ := backends.NewInProcessGroup(ranks)
		var out []*prepare.DataLoader
		for _, comm := range comms {
			state, _ := accumulate.NewGradientState(1, false)
			rt := &prepare.Runtime{Backend: backend, Comm: comm, State: state}
			l, _ := prepare.NewDataLoader(rt, source, prepare.BatchSize(2))
			out = append(out, l)
		}
		return out
	}
	two := loaders(2)
	saved, _ := two[0].StateAfterBatches(0, 2) // 2 batches of 2 on each of 2 ranks
	fmt.Printf("saved by 2 ranks: %+v\n", saved)
	for rank, l := range loaders(3) {
		_ = l.Restore(saved)
		fmt.Print("rank ", rank, ":")
		for batch := range l.All() {
			fmt.Print(" ", batch.Indices)
		}
		fmt.Println()
	}
	// Output:
	// saved by 2 ranks: {Epoch:0 Consumed:8}
	// rank 0: [8 11]
	// rank 1: [9 0]
	// rank 2: [10 1]
}
