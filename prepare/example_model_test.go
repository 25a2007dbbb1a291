package prepare_test

import (
	"fmt"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	_ "github.com/goaccel/goaccel/cpu/kernels" // goaccel's kernels, as accel links them
	"github.com/goaccel/goaccel/prepare"
)

// A Model and an Optimizer built on a Runtime directly (the Accelerator does this for you): the model's
// gradients land in bucket-flat accumulators, and Step applies them only on synced steps.
func ExampleNewModel() {
	backend, _ := cpu.New(cpu.Config{Backend: cpu.PureGo})
	state, _ := accumulate.NewGradientState(2, false)
	rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
	model, _ := prepare.NewModel(rt, context.New(), func(ctx *context.Context, in []*Node) []*Node {
		return []*Node{layers.Dense(ctx.In("linear"), in[0], true, 1)}
	}, losses.MeanSquaredError)
	opt, _ := prepare.NewOptimizer(model, optimizers.StochasticGradientDescent())
	batch := prepare.Batch{
		Inputs: []*tensors.Tensor{tensors.FromValue([][]float32{{1, 2}, {3, 4}})},
		Labels: []*tensors.Tensor{tensors.FromValue([][]float32{{1}, {2}})},
	}
	for i := range 2 {
		_ = state.Accumulate(func() error {
			if _, err := model.Backward(batch, state.MicroBatchScale()); err != nil {
				return err
			}
			stepped, err := opt.Step()
			fmt.Println("micro-batch", i, "stepped:", stepped)
			return err
		})
	}
	plan := model.Plan()
	fmt.Println("buckets:", len(plan.Buckets), "parameters:", len(plan.Params), "steps:", opt.Steps())
	// Output:
	// micro-batch 0 stepped: false
	// micro-batch 1 stepped: true
	// buckets: 1 parameters: 2 steps: 1
}

// An optimizer's State holds its counters and the GoMLX optimizer's type; Restore refuses the state of
// another kind of optimizer, whose variables would not fit this one.
func ExampleOptimizer_State() {
	backend, _ := cpu.New(cpu.Config{Backend: cpu.PureGo})
	state, _ := accumulate.NewGradientState(1, false)
	rt := &prepare.Runtime{Backend: backend, Comm: backends.NewSingle(), State: state}
	model, _ := prepare.NewModel(rt, context.New(), func(ctx *context.Context, in []*Node) []*Node {
		return []*Node{layers.Dense(ctx.In("linear"), in[0], true, 1)}
	}, losses.MeanSquaredError)
	opt, _ := prepare.NewOptimizer(model, optimizers.StochasticGradientDescent())
	saved := opt.State()
	fmt.Println(saved.Kind, saved.Steps)
	saved.Steps = 7
	fmt.Println(opt.Restore(saved), opt.Steps())
	saved.Kind = "*optimizers.Adam"
	fmt.Println(opt.Restore(saved) != nil, opt.Steps())
	// Output:
	// *optimizers.SGDConfig 0
	// <nil> 7
	// true 7
}
