package accumulate_test

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/accumulate"
)

// A two-layer model's parameters, in the order the model created them. The plan walks them backwards —
// the last layer's gradients are ready first — and starts a new bucket whenever the next parameter would
// overflow the current one: 64 bytes for the first bucket, 160 for the others.
func ExampleNewPlan() {
	params := []accumulate.Param{
		{Name: "dense0/weights", Shape: shapes.Make(dtypes.Float32, 4, 8)},
		{Name: "dense0/biases", Shape: shapes.Make(dtypes.Float32, 8)},
		{Name: "dense1/weights", Shape: shapes.Make(dtypes.Float32, 8, 2)},
		{Name: "dense1/biases", Shape: shapes.Make(dtypes.Float32, 2)},
	}
	plan, err := accumulate.NewPlan(params, 64, 160)
	if err != nil {
		fmt.Println(err)
		return
	}
	for b, bucket := range plan.Buckets {
		fmt.Printf("bucket %d: %s, %d elements, %d bytes\n", b, bucket.DType, bucket.Size, bucket.Bytes())
		for _, slot := range bucket.Slots {
			fmt.Printf("  [%d:%d] %s\n", slot.Offset, slot.Offset+slot.Size, params[slot.Param].Name)
		}
	}
	fmt.Println("total bytes:", plan.TotalBytes())
	// Output:
	// bucket 0: Float32, 2 elements, 8 bytes
	//   [0:2] dense1/biases
	// bucket 1: Float32, 24 elements, 96 bytes
	//   [0:16] dense1/weights
	//   [16:24] dense0/biases
	// bucket 2: Float32, 32 elements, 128 bytes
	//   [0:32] dense0/weights
	// total bytes: 232
}

// With K=4, a loader of six batches syncs on the 4th call (a full cycle) and on the 6th, its last batch:
// the short final cycle is not carried into the next epoch.
func ExampleGradientState() {
	state, err := accumulate.NewGradientState(4, false)
	if err != nil {
		fmt.Println(err)
		return
	}
	const batches = 6
	for i := 1; i <= batches; i++ {
		state.SetEndOfDataloader(i == batches) // the data loader does this
		_ = state.Accumulate(func() error {
			state.RecordMicroBatch(state.MicroBatchScale()) // the model's Backward does this
			fmt.Printf("call %d: scale %.2f, sync %v", i, state.MicroBatchScale(), state.SyncGradients())
			if state.SyncGradients() {
				fmt.Printf(", correction %.0f", state.SyncCorrection())
				state.ResetMicroBatches()
			}
			fmt.Println()
			return nil
		})
	}
	state.SetEndOfDataloader(false)
	// Output:
	// call 1: scale 0.25, sync false
	// call 2: scale 0.25, sync false
	// call 3: scale 0.25, sync false
	// call 4: scale 0.25, sync true, correction 1
	// call 5: scale 0.25, sync false
	// call 6: scale 0.25, sync true, correction 2
}

// An evaluation loop inside the training loop enters its own loader: while it runs it decides the
// end-of-dataloader flag, and leaving it gives the training loader's flag back, so the training loader's
// last batch still ends the accumulation cycle.
func ExampleGradientState_EnterLoader() {
	state, _ := accumulate.NewGradientState(2, false)
	exitTrain := state.EnterLoader("train", 0)
	state.SetEndOfDataloader(true) // the training loader yields its last batch
	exitEval := state.EnterLoader("eval", 0)
	fmt.Println("in the evaluation loop:", state.ActiveLoader(), state.EndOfDataloader())
	exitEval()
	fmt.Println("back in training:", state.ActiveLoader(), state.EndOfDataloader())
	_ = state.Accumulate(func() error {
		fmt.Println("sync:", state.SyncGradients(), "remainder:", state.Remainder())
		return nil
	})
	exitTrain()
	fmt.Println("after the loops:", state.ActiveLoader(), state.Remainder())
	// Output:
	// in the evaluation loop: eval false
	// back in training: train true
	// sync: true remainder: 0
	// after the loops: <nil> -1
}

// With SyncEachBatch every micro-batch inside Accumulate is all-reduced (ReduceThisStep), but the
// optimizer still steps only every K-th (SyncGradients).
func ExampleGradientState_ReduceThisStep() {
	state, _ := accumulate.NewGradientState(2, true)
	for i := 1; i <= 4; i++ {
		_ = state.Accumulate(func() error {
			fmt.Printf("call %d: all-reduce %v, step %v\n", i, state.ReduceThisStep(), state.SyncGradients())
			return nil
		})
	}
	// Output:
	// call 1: all-reduce true, step false
	// call 2: all-reduce true, step true
	// call 3: all-reduce true, step false
	// call 4: all-reduce true, step true
}
