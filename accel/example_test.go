package accel_test

import (
	"fmt"
	"os"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accel"
)

// linear is a one-layer model: predictions = inputs·W + b.
func linear(ctx *context.Context, inputs []*Node) []*Node {
	return []*Node{layers.Dense(ctx.In("linear"), inputs[0], true, 1)}
}

// lineData is y = 3x - 1 on n points.
func lineData(n int) accel.Source {
	x := make([]float32, n)
	y := make([]float32, n)
	for i := range x {
		x[i] = float32(i)/float32(n) - 0.5
		y[i] = 3*x[i] - 1
	}
	src, err := accel.TensorSource([]*tensors.Tensor{tensors.FromFlatDataAndDimensions(x, n, 1)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(y, n, 1)})
	if err != nil {
		panic(err)
	}
	return src
}

// The whole loop: prepare the model, the optimizer and the data, then wrap each step in Accumulate. The
// same program runs unchanged as several processes under `accel launch -n N`.
func Example() {
	acc, err := accel.New(accel.WithGradientAccumulationSteps(4), accel.WithSeed(1))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer acc.Close()
	model, err := acc.PrepareModel(context.New(), linear, losses.MeanSquaredError)
	if err != nil {
		fmt.Println(err)
		return
	}
	opt, err := acc.PrepareOptimizer(model, optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(0.5))
	if err != nil {
		fmt.Println(err)
		return
	}
	loader, err := acc.PrepareDataLoader(lineData(64), accel.BatchSize(4), accel.Shuffle())
	if err != nil {
		fmt.Println(err)
		return
	}
	var lastLoss float64
	for epoch := range 20 {
		loader.SetEpoch(epoch)
		for batch, err := range loader.All() {
			if err != nil {
				fmt.Println(err)
				return
			}
			err = acc.Accumulate(func() error {
				if lastLoss, err = acc.Backward(model, batch); err != nil {
					return err
				}
				if _, err := opt.Step(); err != nil { // applies only on every 4th micro-batch
					return err
				}
				err := opt.ZeroGrad()
				return err
			})
			if err != nil {
				fmt.Println(err)
				return
			}
		}
	}
	stats := acc.Stats()
	acc.Printf("micro-batches %d, optimizer steps %d, syncs %d, loss below 1e-3: %v\n",
		stats.MicroBatches, stats.OptimizerSteps, stats.Syncs, lastLoss < 1e-3)
	// Output:
	// micro-batches 320, optimizer steps 80, syncs 80, loss below 1e-3: true
}

// New reads the topology from the launcher: run directly, this is a single process on the pure-Go backend.
func ExampleNew() {
	acc, err := accel.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer acc.Close()
	fmt.Println("rank", acc.Rank(), "of", acc.WorldSize(), "main:", acc.IsMainProcess(),
		"engine:", acc.Communicator().Name(), "K:", acc.GradientAccumulationSteps())
	// Output:
	// rank 0 of 1 main: true engine: single K: 1
}

// NoSync is the manual form of accumulation: gradients add up locally, and the first Backward outside
// NoSync synchronises them all. LossScale(1/K) averages the K micro-batches.
func ExampleAccelerator_NoSync() {
	acc, _ := accel.New(accel.WithSeed(1))
	defer acc.Close()
	model, _ := acc.PrepareModel(context.New(), linear, losses.MeanSquaredError)
	opt, _ := acc.PrepareOptimizer(model, optimizers.StochasticGradientDescent())
	loader, _ := acc.PrepareDataLoader(lineData(16), accel.BatchSize(4))
	const k = 2
	i := 0
	for batch := range loader.All() {
		scale := accel.LossScale(1.0 / k)
		if i++; i%k != 0 {
			_ = acc.NoSync(func() error {
				_, err := acc.Backward(model, batch, scale)
				fmt.Println("batch", i, "synced:", acc.SyncGradients())
				return err
			})
			continue
		}
		_, _ = acc.Backward(model, batch, scale)
		stepped, _ := opt.Step()
		fmt.Println("batch", i, "synced:", acc.SyncGradients(), "stepped:", stepped)
	}
	// Output:
	// batch 1 synced: false
	// batch 2 synced: true stepped: true
	// batch 3 synced: false
	// batch 4 synced: true stepped: true
}

// SaveState writes an atomic checkpoint; LoadState in a new run resumes exactly where it stopped.
func ExampleAccelerator_SaveState() {
	dir, _ := os.MkdirTemp("", "goaccel-example")
	defer os.RemoveAll(dir)
	train := func(resume bool, batches int) (int64, int) {
		acc, _ := accel.New(accel.WithSeed(1))
		defer acc.Close()
		model, _ := acc.PrepareModel(context.New(), linear, losses.MeanSquaredError)
		opt, _ := acc.PrepareOptimizer(model, optimizers.Adam().Done())
		loader, _ := acc.PrepareDataLoader(lineData(32), accel.BatchSize(4))
		if resume {
			if err := acc.LoadState(dir); err != nil {
				fmt.Println(err)
			}
		}
		ran := 0
		for batch := range loader.All() {
			_, _ = acc.Backward(model, batch)
			_, _ = opt.Step()
			if ran++; ran == batches {
				break // save after a processed batch: the loader's position counts the batches it handed out
			}
		}
		if !resume {
			if _, err := acc.SaveState(dir); err != nil {
				fmt.Println(err)
			}
		}
		return opt.Steps(), ran
	}
	steps, ran := train(false, 3)
	fmt.Println("first run: steps", steps, "batches", ran)
	steps, ran = train(true, -1)
	fmt.Println("resumed run: steps", steps, "batches", ran)
	// Output:
	// first run: steps 3 batches 3
	// resumed run: steps 8 batches 5
}

// GatherForMetrics collects per-example results from every process and drops the examples that even
// batching repeated, so each example counts once.
func ExampleAccelerator_GatherForMetrics() {
	acc, _ := accel.New()
	defer acc.Close()
	loader, _ := acc.PrepareDataLoader(lineData(10), accel.BatchSize(4))
	total := 0
	for batch := range loader.All() {
		ids := make([]int32, len(batch.Indices))
		for i, idx := range batch.Indices {
			ids[i] = int32(idx)
		}
		all, _ := acc.GatherForMetrics(tensors.FromFlatDataAndDimensions(ids, len(ids)), batch)
		total += all.Shape().Dimensions[0]
	}
	fmt.Println("examples counted:", total)
	// Output:
	// examples counted: 10
}

// MainProcessFirst lets the main process fill a cache before the others read it.
func ExampleAccelerator_MainProcessFirst() {
	acc, _ := accel.New()
	defer acc.Close()
	_ = acc.MainProcessFirst(func() error {
		fmt.Println("preparing data on rank", acc.Rank())
		return nil
	})
	// Output:
	// preparing data on rank 0
}
