package prepare_test

import (
	"fmt"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	_ "github.com/goaccel/goaccel/cpu/kernels" // goaccel's kernels, as accel links them
	"github.com/goaccel/goaccel/prepare"
)

// weightsOnly is y = x·w with w a [2, 1] variable starting at zero: at w = 0 the mean squared error's
// gradient on the batch below is -(1·(1,2) + 2·(3,4)) = (-7, -10).
func weightsOnly(ctx *context.Context, in []*Node) []*Node {
	w := ctx.In("linear").VariableWithValue("w", [][]float32{{0}, {0}})
	return []*Node{MatMul(in[0], w.ValueGraph(in[0].Graph()))}
}

var exampleBatch = prepare.Batch{
	Inputs: []*tensors.Tensor{tensors.FromValue([][]float32{{1, 2}, {3, 4}})},
	Labels: []*tensors.Tensor{tensors.FromValue([][]float32{{1}, {2}})},
}

// newExampleModel prepares weightsOnly with SGD (learning rate 0.1) on one process, K micro-batches per step.
func newExampleModel(k int) (*accumulate.GradientState, *prepare.Model, *prepare.Optimizer) {
	backend, _ := cpu.New(cpu.Config{Backend: cpu.PureGo})
	state, _ := accumulate.NewGradientState(k, false)
	rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
	model, _ := prepare.NewModel(rt, context.New(), weightsOnly, losses.MeanSquaredError)
	opt, _ := prepare.NewOptimizer(model, optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(0.1))
	return state, model, opt
}

// Gradients reads the gradient per parameter: before the sync the local accumulation (each micro-batch
// scaled by 1/K), after it the averaged gradient Step applies.
func ExampleModel_Gradients() {
	state, model, opt := newExampleModel(2)
	for i := range 2 {
		_ = state.Accumulate(func() error {
			if _, err := model.Backward(exampleBatch, state.MicroBatchScale()); err != nil {
				return err
			}
			grads, err := model.Gradients()
			if err != nil {
				return err
			}
			fmt.Printf("micro-batch %d, synced %v: %v\n", i, state.SyncGradients(), grads["/linear/w"].Value())
			_, err = opt.Step()
			return err
		})
	}
	// Output:
	// micro-batch 0, synced false: [[-3.5] [-5]]
	// micro-batch 1, synced true: [[-7] [-10]]
}

// ClipGradNorm returns the norm of the synced gradient, √(7²+10²) ≈ 12.21, and scales it to the maximum.
func ExampleModel_ClipGradNorm() {
	_, model, _ := newExampleModel(1)
	_, _ = model.Backward(exampleBatch, 1) // outside Accumulate every Backward syncs
	norm, err := model.ClipGradNorm(1)
	if err != nil {
		fmt.Println(err)
		return
	}
	grads, _ := model.Gradients()
	fmt.Printf("norm before %.2f, gradient after %.3f\n", norm, grads["/linear/w"].Value())
	// Output:
	// norm before 12.21, gradient after [[-0.573] [-0.819]]
}

// ClipGradValue clamps every synced gradient value.
func ExampleModel_ClipGradValue() {
	_, model, _ := newExampleModel(1)
	_, _ = model.Backward(exampleBatch, 1)
	if err := model.ClipGradValue(8); err != nil {
		fmt.Println(err)
		return
	}
	grads, _ := model.Gradients()
	fmt.Println(grads["/linear/w"].Value())
	// Output:
	// [[-7] [-8]]
}

// A Scheduler sets the learning rate of every optimizer step from Go: here 0.1 halved at each step. With
// K=2 it moves once per optimizer step, not per micro-batch.
func ExampleNewScheduler() {
	state, model, opt := newExampleModel(2)
	sched, err := prepare.NewScheduler(opt, func(step int64) float64 { return 0.1 / float64(int64(1)<<step) })
	if err != nil {
		fmt.Println(err)
		return
	}
	for i := range 4 {
		_ = state.Accumulate(func() error {
			lr := sched.LearningRate()
			if _, err := model.Backward(exampleBatch, state.MicroBatchScale()); err != nil {
				return err
			}
			stepped, err := opt.Step()
			if err == nil {
				err = opt.ZeroGrad()
			}
			fmt.Printf("micro-batch %d: rate %.3f, stepped %v\n", i, lr, stepped)
			return err
		})
	}
	fmt.Printf("next rate %.4f after %d steps\n", sched.LearningRate(), opt.Steps())
	// Output:
	// micro-batch 0: rate 0.100, stepped false
	// micro-batch 1: rate 0.100, stepped true
	// micro-batch 2: rate 0.050, stepped false
	// micro-batch 3: rate 0.050, stepped true
	// next rate 0.0250 after 2 steps
}

// FromTrainModelFn plugs a GoMLX model function written for train.Trainer (with its spec argument) into
// goaccel unchanged.
func ExampleFromTrainModelFn() {
	var gomlxModel train.ModelFn = func(ctx *context.Context, spec any, inputs []*Node) []*Node {
		fmt.Println("spec:", spec)
		return weightsOnly(ctx, inputs)
	}
	backend, _ := cpu.New(cpu.Config{Backend: cpu.PureGo})
	state, _ := accumulate.NewGradientState(1, false)
	rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
	model, _ := prepare.NewModel(rt, context.New(), prepare.FromTrainModelFn(gomlxModel, nil), losses.MeanSquaredError)
	loss, err := model.Backward(exampleBatch, 1)
	fmt.Println("loss:", loss, err)
	// Output:
	// spec: <nil>
	// spec: <nil>
	// loss: 2.5 <nil>
}

// BackwardOutputs returns, with the loss, the model's predictions and the TrainMetrics values of the same
// forward pass.
func ExampleModel_BackwardOutputs() {
	backend, _ := cpu.New(cpu.Config{Backend: cpu.PureGo})
	state, _ := accumulate.NewGradientState(1, false)
	rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
	meanLabel := func(_ *context.Context, labels, _ []*Node) []*Node { return []*Node{ReduceAllMean(labels[0])} }
	model, _ := prepare.NewModel(rt, context.New(), weightsOnly, losses.MeanSquaredError, prepare.TrainMetrics(meanLabel))
	res, err := model.BackwardOutputs(exampleBatch, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("loss", res.Loss, "predictions", res.Outputs[0].Value(), "mean label", res.Metrics[0].Value())
	// Output:
	// loss 2.5 predictions [[0] [0]] mean label 1.5
}

// TrainMetrics declares in-graph metrics for BackwardOutputs (and the Accelerator's Backward with
// accel.Metrics).
func ExampleTrainMetrics() {
	backend, _ := cpu.New(cpu.Config{Backend: cpu.PureGo})
	state, _ := accumulate.NewGradientState(1, false)
	rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
	maxError := func(_ *context.Context, labels, predictions []*Node) []*Node {
		return []*Node{ReduceAllMax(Abs(Sub(labels[0], predictions[0])))}
	}
	model, _ := prepare.NewModel(rt, context.New(), weightsOnly, losses.MeanSquaredError, prepare.TrainMetrics(maxError))
	res, _ := model.BackwardOutputs(exampleBatch, 1)
	fmt.Println("max error:", res.Metrics[0].Value())
	// Output:
	// max error: 2
}
