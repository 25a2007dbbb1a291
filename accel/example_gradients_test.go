package accel_test

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accel"
)

// exampleLoop prepares the two-weight linear model of the conformance tests (w starts at 0) with SGD at
// 0.1 and a loader of batches of 2 over n examples, then runs body inside Accumulate after each Backward.
func exampleLoop(acc *accel.Accelerator, n int, body func(model *accel.Model, opt *accel.Optimizer) error) error {
	model, err := acc.PrepareModel(context.New(), linearModel(0, false), losses.MeanSquaredError)
	if err != nil {
		return err
	}
	opt, err := acc.PrepareOptimizer(model, optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(0.1))
	if err != nil {
		return err
	}
	src, err := linSource(n, 0, 0)
	if err != nil {
		return err
	}
	loader, err := acc.PrepareDataLoader(src, accel.BatchSize(2))
	if err != nil {
		return err
	}
	for batch, err := range loader.All() {
		if err != nil {
			return err
		}
		err = acc.Accumulate(func() error {
			if _, err := acc.Backward(model, batch); err != nil {
				return err
			}
			if err := body(model, opt); err != nil {
				return err
			}
			if _, err := opt.Step(); err != nil {
				return err
			}
			return opt.ZeroGrad()
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// GradientState tells, inside Accumulate, whether this micro-batch steps and where the loader is: with
// K=2 over 5 examples in batches of 2, the last batch is short (remainder 1) and ends the cycle early.
func ExampleAccelerator_GradientState() {
	acc, _ := accel.New(accel.WithGradientAccumulationSteps(2))
	defer acc.Close()
	err := exampleLoop(acc, 5, func(*accel.Model, *accel.Optimizer) error {
		gs := acc.GradientState()
		fmt.Printf("step in cycle %d: sync %v, end of loader %v, remainder %d, in a loader %v\n",
			gs.StepInCycle(), gs.SyncGradients(), gs.EndOfDataloader(), gs.Remainder(), acc.ActiveDataLoader() != nil)
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	fmt.Println("outside: loader", acc.ActiveDataLoader(), "remainder", acc.GradientState().Remainder())
	// Output:
	// step in cycle 1: sync false, end of loader false, remainder 1, in a loader true
	// step in cycle 2: sync true, end of loader false, remainder 1, in a loader true
	// step in cycle 1: sync true, end of loader true, remainder 1, in a loader true
	// outside: loader <nil> remainder -1
}

// ClipGradNorm between a syncing Backward and Step returns the averaged gradient's norm and clips it; on
// micro-batches that do not sync it does nothing and returns 0. By hand: the first micro-batch's gradient
// is (7/3, -4/3), halved by K=2; the step's mean over four examples is (5/3, -2/3), of norm 1.7951.
func ExampleAccelerator_ClipGradNorm() {
	acc, _ := accel.New(accel.WithGradientAccumulationSteps(2))
	defer acc.Close()
	err := exampleLoop(acc, 4, func(model *accel.Model, _ *accel.Optimizer) error {
		norm, err := acc.ClipGradNorm(model, 1)
		if err != nil {
			return err
		}
		grads, err := model.Gradients()
		if err != nil {
			return err
		}
		fmt.Printf("sync %v: norm %.4f, gradient now %.4f\n", acc.SyncGradients(), norm, grads["/linear/w"].Value())
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// sync false: norm 0.0000, gradient now [[1.1667] [-0.6667]]
	// sync true: norm 1.7951, gradient now [[0.9285] [-0.3714]]
}

// ClipGradValue clamps the averaged gradient's values before Step.
func ExampleAccelerator_ClipGradValue() {
	acc, _ := accel.New()
	defer acc.Close()
	err := exampleLoop(acc, 2, func(model *accel.Model, _ *accel.Optimizer) error {
		if err := acc.ClipGradValue(model, 0.5); err != nil {
			return err
		}
		grads, err := model.Gradients()
		if err == nil {
			fmt.Printf("%.4f\n", grads["/linear/w"].Value())
		}
		return err
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// [[0.5000] [-0.5000]]
}

// PrepareScheduler drives the learning rate from Go, once per optimizer step: a warm-up over two steps,
// then constant.
func ExampleAccelerator_PrepareScheduler() {
	acc, _ := accel.New(accel.WithGradientAccumulationSteps(2))
	defer acc.Close()
	var sched *accel.Scheduler
	err := exampleLoop(acc, 12, func(_ *accel.Model, opt *accel.Optimizer) error {
		if sched == nil {
			var err error
			sched, err = acc.PrepareScheduler(opt, func(step int64) float64 { return 0.1 * min(float64(step+1)/2, 1) })
			if err != nil {
				return err
			}
		}
		if acc.SyncGradients() {
			fmt.Printf("step %d at rate %.2f\n", opt.Steps()+1, sched.LearningRate())
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// step 1 at rate 0.05
	// step 2 at rate 0.10
	// step 3 at rate 0.10
}

// With WithSyncEachBatch every micro-batch is all-reduced as soon as its gradient exists, while the
// optimizer still steps once every K micro-batches: the weights are those of plain accumulation.
func ExampleWithSyncEachBatch() {
	acc, _ := accel.New(accel.WithGradientAccumulationSteps(2), accel.WithSyncEachBatch())
	defer acc.Close()
	err := exampleLoop(acc, 8, func(*accel.Model, *accel.Optimizer) error { return nil })
	if err != nil {
		fmt.Println(err)
	}
	stats := acc.Stats()
	fmt.Println("micro-batches", stats.MicroBatches, "all-reduce rounds", stats.Syncs, "optimizer steps", stats.OptimizerSteps)
	// Output:
	// micro-batches 4 all-reduce rounds 4 optimizer steps 2
}

// Prepare makes the model, its optimizer, a schedule and the loaders in one call, with typed results.
func ExampleAccelerator_Prepare() {
	acc, _ := accel.New(accel.WithGradientAccumulationSteps(2))
	defer acc.Close()
	src, _ := linSource(8, 0, 0)
	p, err := acc.Prepare(accel.Spec{
		Model:     linearModel(0, false),
		Loss:      losses.MeanSquaredError,
		Optimizer: optimizers.StochasticGradientDescent().WithDecay(false),
		Schedule:  func(step int64) float64 { return 0.1 },
		Loaders:   []accel.LoaderSpec{{Source: src, Options: []accel.LoaderOption{accel.BatchSize(2)}}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for batch, err := range p.Loaders[0].All() {
		if err != nil {
			fmt.Println(err)
			return
		}
		_ = acc.Accumulate(func() error {
			if _, err := acc.Backward(p.Model, batch); err != nil {
				return err
			}
			if _, err := p.Optimizer.Step(); err != nil {
				return err
			}
			return p.Optimizer.ZeroGrad()
		})
	}
	fmt.Println("optimizer steps:", p.Optimizer.Steps(), "next rate:", p.Scheduler.LearningRate())
	// Output:
	// optimizer steps: 2 next rate: 0.1
}

// Outputs returns the predictions of the forward pass Backward trains on: at w = 0 they are zero.
func ExampleOutputs() {
	acc, _ := accel.New()
	defer acc.Close()
	model, _ := acc.PrepareModel(context.New(), linearModel(0, false), losses.MeanSquaredError)
	src, _ := linSource(2, 0, 0)
	loader, _ := acc.PrepareDataLoader(src, accel.BatchSize(2))
	for batch := range loader.All() {
		var outputs []*tensors.Tensor
		loss, err := acc.Backward(model, batch, accel.Outputs(&outputs))
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("loss %.4f, predictions %v\n", loss, outputs[0].Value())
	}
	// Output:
	// loss 0.7222, predictions [[0] [0]]
}

// Metrics returns in-graph training metrics declared with accel.TrainMetrics — here the accuracy of the
// predictions' sign — from the training forward pass: 0 at w = 0, 1 once SGD took a step.
func ExampleMetrics() {
	acc, _ := accel.New()
	defer acc.Close()
	accuracy := func(_ *context.Context, labels, predictions []*Node) []*Node {
		right := Equal(Sign(predictions[0]), Sign(labels[0]))
		return []*Node{ReduceAllMean(ConvertDType(right, dtypes.Float64))}
	}
	model, _ := acc.PrepareModel(context.New(), linearModel(0, false), losses.MeanSquaredError, accel.TrainMetrics(accuracy))
	opt, _ := acc.PrepareOptimizer(model, optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(0.1))
	src, _ := linSource(2, 0, 0)
	loader, _ := acc.PrepareDataLoader(src, accel.BatchSize(2))
	for epoch := range 2 {
		for batch := range loader.All() {
			var metrics []*tensors.Tensor
			if _, err := acc.Backward(model, batch, accel.Metrics(&metrics)); err != nil {
				fmt.Println(err)
				return
			}
			_, _ = opt.Step()
			_ = opt.ZeroGrad()
			fmt.Println("epoch", epoch, "train accuracy:", metrics[0].Value())
		}
	}
	// Output:
	// epoch 0 train accuracy: 0
	// epoch 1 train accuracy: 1
}

// WithSplitBatches makes the loader's batch size global, divided among the processes: on one process a
// batch of 4 stays 4, on 2 processes each takes 2.
func ExampleWithSplitBatches() {
	acc, _ := accel.New(accel.WithSplitBatches())
	defer acc.Close()
	src, _ := linSource(8, 0, 0)
	loader, err := acc.PrepareDataLoader(src, accel.BatchSize(4))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("processes:", acc.WorldSize(), "per process:", loader.BatchSize(), "batches:", loader.Len())
	// Output:
	// processes: 1 per process: 4 batches: 2
}

// DataLoss reports the loss function's value without the regularizers the model adds with train.AddLoss
// (here L2 of 0.5 on the linear model's weights, both 1 after one step), which Backward's loss includes.
func ExampleDataLoss() {
	acc, _ := accel.New()
	defer acc.Close()
	model, _ := acc.PrepareModel(context.New(), func(ctx *context.Context, in []*Node) []*Node {
		w := ctx.In("linear").VariableWithValue("w", [][]float64{{1}, {1}})
		train.AddLoss(ctx, MulScalar(ReduceAllSum(Square(w.ValueGraph(in[0].Graph()))), 0.5)) // 0.5·Σw² = 1
		return []*Node{MatMul(in[0], w.ValueGraph(in[0].Graph()))}
	}, losses.MeanSquaredError)
	batch := accel.Batch{Inputs: []*tensors.Tensor{tensors.FromValue([][]float64{{1, 2}})},
		Labels: []*tensors.Tensor{tensors.FromValue([][]float64{{5}})}} // prediction 3: squared error 4
	var dataLoss float64
	loss, err := acc.Backward(model, batch, accel.DataLoss(&dataLoss))
	fmt.Println(loss, dataLoss, err)
	// Output:
	// 5 4 <nil>
}

// A schedule sized by the job: Prepare counts the optimizer steps (8 examples in batches of 2, K = 2: 2
// steps per epoch; 3 epochs) and gives the cosine schedule that total.
func ExampleAccelerator_OptimizerStepsPerEpoch() {
	acc, _ := accel.New(accel.WithGradientAccumulationSteps(2))
	defer acc.Close()
	src, _ := linSource(8, 0, 0)
	p, err := acc.Prepare(accel.Spec{Model: linearModel(0, false), Loss: losses.MeanSquaredError,
		Optimizer: optimizers.StochasticGradientDescent().WithDecay(false).Done(), SizedSchedule: accel.Cosine(0.1, 1),
		Epochs: 3, Loaders: []accel.LoaderSpec{{Source: src, Options: []accel.LoaderOption{accel.BatchSize(2)}}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	perEpoch, _ := acc.OptimizerStepsPerEpoch(p.Loaders[0])
	fmt.Println("optimizer steps per epoch:", perEpoch)
	fmt.Printf("first rate after warm-up: %.3f\n", accel.Cosine(0.1, 1)(3*perEpoch)(1))
	fmt.Printf("next step's rate: %.3f\n", p.Scheduler.LearningRate())
	// Output:
	// optimizer steps per epoch: 2
	// first rate after warm-up: 0.100
	// next step's rate: 0.000
}
