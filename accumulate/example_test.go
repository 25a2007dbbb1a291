package accumulate_test

import (
	"errors"
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
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
			fmt.Printf("call %d: scale %.2f, sync %v\n", i, state.MicroBatchScale(), state.SyncGradients())
			return nil
		})
	}
	state.SetEndOfDataloader(false)
	// Output:
	// call 1: scale 0.25, sync false
	// call 2: scale 0.25, sync false
	// call 3: scale 0.25, sync false
	// call 4: scale 0.25, sync true
	// call 5: scale 0.25, sync false
	// call 6: scale 0.25, sync true
}

// An evaluation loop inside the training loop enters its own loader: while it runs it decides the
// end-of-dataloader flag, and leaving it gives the training loader's flag back, so the training loader's
// last batch still ends the accumulation cycle.
func ExampleGradientState_EnterLoader() {
	state, _ := accumulate.NewGradientState(2, false)
	exitTrain := state.EnterLoader(loop{"train", 3}, 0)
	state.SetEndOfDataloader(true) // the training loader yields its last batch
	exitEval := state.EnterLoader(loop{"eval", 1}, 0)
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

// With SyncEachBatch the reducer all-reduces every micro-batch inside Accumulate (its sync count grows on
// every call), but the optimizer still steps only every K-th (SyncGradients).
func ExampleGradientState_SyncEachBatch() {
	state, _ := accumulate.NewGradientState(2, true)
	plan, _ := accumulate.NewPlan([]accumulate.Param{{Name: "w", Shape: shapes.Make(dtypes.Float32, 1)}}, 0, 1<<20)
	acc := context.New().VariableWithValue("bucket_000", []float32{0})
	reducer := accumulate.NewReducer(backends.NewSingle(), plan, accumulate.WithGradientState(state),
		accumulate.WithAccumulators([]*context.Variable{acc}))
	for i := 1; i <= 4; i++ {
		_ = state.Accumulate(func() error {
			if err := reducer.EndMicroBatch(state.MicroBatchScale(), 0.5); err != nil {
				return err
			}
			fmt.Printf("call %d: syncs so far %d, step %v\n", i, reducer.Syncs(), state.SyncGradients())
			if reducer.ReadyToApply() {
				reducer.Applied() // the optimizer's Step does this
			}
			return nil
		})
	}
	// Output:
	// call 1: syncs so far 1, step false
	// call 2: syncs so far 2, step true
	// call 3: syncs so far 3, step false
	// call 4: syncs so far 4, step true
}

// loggingHook is a communication hook that reports each bucket and reduces it unchanged: a compressing hook
// would encode b.Buffer into a narrower buffer here and decode it in the returned waiter's Wait.
type loggingHook struct{}

func (loggingHook) Name() string { return "logging" }

func (loggingHook) Start(comm *backends.Communicator, sharding accumulate.Sharding, b accumulate.GradBucket) (accumulate.Waiter, error) {
	fmt.Printf("bucket %d: %d %s elements\n", b.Index, b.Buffer.Len, b.Buffer.Kind)
	return accumulate.IdentityHook{}.Start(comm, sharding, b)
}

// A reducer registered with a communication hook hands it every bucket of a sync, in plan order.
func ExampleWithCommHook() {
	plan, err := accumulate.NewPlan([]accumulate.Param{
		{Name: "w", Shape: shapes.Make(dtypes.Float32, 3)},
		{Name: "b", Shape: shapes.Make(dtypes.Float64, 2)},
	}, 0, 1<<20)
	if err != nil {
		fmt.Println(err)
		return
	}
	comms, err := backends.NewInProcessGroup(2)
	if err != nil {
		fmt.Println(err)
		return
	}
	buckets := func() []*tensors.Tensor {
		return []*tensors.Tensor{tensors.FromValue([]float64{1, 2}), tensors.FromValue([]float32{1, 2, 3})}
	}
	mine, theirs := buckets(), buckets()
	done := make(chan error)
	go func() { done <- accumulate.NewReducer(comms[1], plan).Sync(theirs) }()
	err = accumulate.NewReducer(comms[0], plan, accumulate.WithCommHook(loggingHook{})).Sync(mine)
	fmt.Println(err, <-done, tensors.MustCopyFlatData[float32](mine[1]))
	// Output:
	// bucket 0: 2 float64 elements
	// bucket 1: 3 float32 elements
	// <nil> <nil> [2 4 6]
}

// A reducer's State is what a checkpoint keeps of it: this rank's partial sums, bucket by bucket, and
// whether they hold an unfinished accumulation cycle. Restore puts them back.
func ExampleReducer_State() {
	plan, err := accumulate.NewPlan([]accumulate.Param{{Name: "w", Shape: shapes.Make(dtypes.Float32, 2)}}, 0, 1<<20)
	if err != nil {
		fmt.Println(err)
		return
	}
	newReducer := func() (*accumulate.Reducer, *accumulate.GradientState, *context.Variable) {
		state, _ := accumulate.NewGradientState(2, false)
		acc := context.New().VariableWithValue("bucket_000", []float32{0, 0})
		return accumulate.NewReducer(backends.NewSingle(), plan, accumulate.WithGradientState(state),
			accumulate.WithAccumulators([]*context.Variable{acc})), state, acc
	}
	reducer, state, acc := newReducer()
	_ = state.Accumulate(func() error {
		_ = acc.SetValue(tensors.FromValue([]float32{0.5, -1})) // the training step does this
		return reducer.EndMicroBatch(state.MicroBatchScale(), 0.1)
	})
	saved, err := reducer.State()
	fmt.Println(err, saved.Accumulating, len(saved.Accumulators[0]), "bytes")

	restored, _, restoredAcc := newReducer()
	fmt.Println(restored.Restore(saved), tensors.MustCopyFlatData[float32](must(restoredAcc.Value())))
	// Output:
	// <nil> true 8 bytes
	// <nil> [0.5 -1]
}

// The replicated strategy, the default, leaves every rank holding the whole synchronised bucket: each
// rank owns all of it. A ZeRO-1 strategy would own one shard per rank and reduce-scatter instead.
func ExampleReplicated() {
	plan, _ := accumulate.NewPlan([]accumulate.Param{{Name: "w", Shape: shapes.Make(dtypes.Float32, 10)}}, 0, 1<<20)
	reducer := accumulate.NewReducer(backends.NewSingle(), plan, accumulate.WithSharding(accumulate.Replicated{}))
	for rank := range 4 {
		from, to := reducer.Sharding().Owned(plan.Buckets[0].Size, rank, 4)
		fmt.Printf("rank %d owns [%d:%d]\n", rank, from, to)
	}
	fmt.Println(reducer.Sharding().Name(), reducer.CommHook().Name())
	// Output:
	// rank 0 owns [0:10]
	// rank 1 owns [0:10]
	// rank 2 owns [0:10]
	// rank 3 owns [0:10]
	// replicated identity
}

// A compression hook sends buckets as 16-bit floats: half the bytes on the wire, summed in float32 on
// arrival, and written back into the float32 bucket. 1 + 1/512 is not a bfloat16 (8 significant bits), so
// it travels as 1.
func ExampleNewCompressionHook() {
	plan, err := accumulate.NewPlan([]accumulate.Param{{Name: "w", Shape: shapes.Make(dtypes.Float32, 3)}}, 0, 1<<20)
	if err != nil {
		fmt.Println(err)
		return
	}
	comms, err := backends.NewInProcessGroup(2)
	if err != nil {
		fmt.Println(err)
		return
	}
	sync := func(rank int, bucket *tensors.Tensor) error {
		hook, err := accumulate.NewCompressionHook(accumulate.BF16)
		if err != nil {
			return err
		}
		return accumulate.NewReducer(comms[rank], plan, accumulate.WithCommHook(hook)).Sync([]*tensors.Tensor{bucket})
	}
	mine, theirs := tensors.FromValue([]float32{1 + 1.0/512, 2, 3}), tensors.FromValue([]float32{1, 0.5, -3})
	done := make(chan error)
	go func() { done <- sync(1, theirs) }()
	err = sync(0, mine)
	fmt.Println(err, <-done, tensors.MustCopyFlatData[float32](mine))
	fmt.Println("bytes on the wire:", comms[0].Stats().Of(backends.OpAllReduce).Bytes, "for a bucket of", plan.Buckets[0].Bytes())
	// Output:
	// <nil> <nil> [2 2.5 0]
	// bytes on the wire: 6 for a bucket of 12
}

// ParseCompression reads the names GOACCEL_GRADIENT_COMPRESSION takes.
func ExampleParseCompression() {
	for _, name := range []string{"bf16", "fp16", "none", "int8"} {
		c, err := accumulate.ParseCompression(name)
		fmt.Println(c, err)
	}
	// Output:
	// bf16 <nil>
	// fp16 <nil>
	// none <nil>
	// none accumulate: unknown gradient compression "int8" (want bf16, fp16 or none)
}

// CheckResume decides whether a checkpoint's gradient state can continue in this run: at an optimizer-step
// boundary anything may change; inside a cycle, the world size, K and sync-each-batch must be the same.
func ExampleGradientState_CheckResume() {
	state, _ := accumulate.NewGradientState(4, false) // this run: K=4
	boundary := accumulate.SavedCycle{WorldSize: 2, Steps: 2}
	inside := accumulate.SavedCycle{WorldSize: 2, Steps: 2, Accumulating: true,
		Position: accumulate.Position{StepInCycle: 1, ScaledMicroBatches: 1}}
	fmt.Println(boundary.AtStepBoundary(), state.CheckResume(boundary, 4), boundary.ResumePosition())
	err := state.CheckResume(inside, 4)
	fmt.Println(inside.AtStepBoundary(), errors.Is(err, accumulate.ErrInsideCycle))
	// Output:
	// true <nil> {0 0 0}
	// false true
}

// GatherState collects every rank's accumulators on the main process for a checkpoint; SavedState gives a
// rank its share back: its own partial sums on the same number of ranks, empty accumulators on another
// number when the checkpoint was at an optimizer-step boundary.
func ExampleReducer_SavedState() {
	plan, _ := accumulate.NewPlan([]accumulate.Param{{Name: "w", Shape: shapes.Make(dtypes.Float32, 2)}}, 0, 1<<20)
	newReducer := func(comm *backends.Communicator) *accumulate.Reducer {
		state, _ := accumulate.NewGradientState(1, false)
		acc := context.New().VariableWithValue("bucket_000", []float32{0, 0})
		return accumulate.NewReducer(comm, plan, accumulate.WithGradientState(state),
			accumulate.WithAccumulators([]*context.Variable{acc}))
	}
	reducer := newReducer(backends.NewSingle())
	state, _ := reducer.State()
	blob, err := reducer.GatherState(state)
	fmt.Println(len(blob), "bytes", err)

	// The same blob, read by rank 1 of a run of 3 processes: the checkpoint was at a step boundary.
	comms, _ := backends.NewInProcessGroup(3)
	share, err := newReducer(comms[1]).SavedState(blob, 1, false)
	fmt.Println(len(share.Accumulators[0]), "bytes", share.Accumulating, err)
	_, err = newReducer(comms[1]).SavedState(blob, 1, true)
	fmt.Println(errors.Is(err, accumulate.ErrInsideCycle))
	// Output:
	// 8 bytes <nil>
	// 8 bytes false <nil>
	// true
}

// loop is a loader of a program's own: a name and its batches per epoch.
type loop struct {
	name    string
	batches int
}

func (l loop) Len() int       { return l.batches }
func (l loop) String() string { return l.name }

// The ZeRO strategies split each bucket into one block per rank: a bucket of 10 elements on 4 ranks is
// padded to 12, blocks of 3, and the last rank's block holds one real element.
func ExampleShardOptimizer() {
	s := accumulate.ShardOptimizer{}
	fmt.Println(s.Name(), "stage", s.Stage(), "padded to", s.Padded(10, 4), "blocks of", accumulate.BlockLen(10, 4))
	for rank := range 4 {
		from, to := s.Owned(10, rank, 4)
		fmt.Printf("rank %d owns [%d:%d]\n", rank, from, to)
	}
	// Output:
	// optimizer stage 1 padded to 12 blocks of 3
	// rank 0 owns [0:3]
	// rank 1 owns [3:6]
	// rank 2 owns [6:9]
	// rank 3 owns [9:10]
}

// GOACCEL_SHARDING's values, and their ZeRO stages.
func ExampleParseSharding() {
	for _, name := range []string{"replicated", "optimizer", "zero2", "fsdp"} {
		s, err := accumulate.ParseSharding(name)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(s.Name(), s.Stage())
	}
	// Output:
	// replicated 0
	// optimizer 1
	// gradients 2
	// accumulate: unknown sharding strategy "fsdp" (want replicated, optimizer or gradients)
}
