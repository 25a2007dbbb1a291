// Command minimal is the smallest complete goaccel program: it fits y = 3x − 1 with SGD, K = 4 gradient
// accumulation steps, on one process or, unchanged, on several:
//
//	go run ./examples/minimal
//	go build -tags mpi -o bin/minimal ./examples/minimal && bin/accel launch -n 2 -- bin/minimal
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accel"
)

func main() {
	if err := run(os.Stdout, 20); err != nil {
		fmt.Fprintln(os.Stderr, "minimal:", err)
		os.Exit(1)
	}
}

// run trains for epochs and prints the learned line on the main process.
func run(out io.Writer, epochs int) (err error) {
	acc, err := accel.New(accel.WithGradientAccumulationSteps(4), accel.WithOutput(out))
	if err != nil {
		return err
	}
	defer func() { _ = acc.CloseWithError(err) }()

	model, err := acc.PrepareModel(context.New(), func(ctx *context.Context, x []*graph.Node) []*graph.Node {
		return []*graph.Node{layers.Dense(ctx.In("line"), x[0], true, 1)}
	}, losses.MeanSquaredError)
	if err != nil {
		return err
	}
	opt, err := acc.PrepareOptimizer(model, optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(0.5))
	if err != nil {
		return err
	}
	loader, err := acc.PrepareDataLoader(line(256), accel.BatchSize(8), accel.Shuffle())
	if err != nil {
		return err
	}

	for epoch := range epochs {
		loader.SetEpoch(epoch)
		for batch, err := range loader.All() {
			if err != nil {
				return err
			}
			err = acc.Accumulate(func() error { // steps and zeroes only on every K-th micro-batch
				if _, err := acc.Backward(model, batch); err != nil {
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
	}
	w, b := weight(model, "weights"), weight(model, "biases")
	acc.Printf("learned y = %.2fx %+.2f after %d optimizer steps\n", w, b, opt.Steps())
	return nil
}

// line is n points of y = 3x − 1 on [−0.5, 0.5).
func line(n int) accel.Source {
	x, y := make([]float32, n), make([]float32, n)
	for i := range n {
		x[i] = float32(i)/float32(n) - 0.5
		y[i] = 3*x[i] - 1
	}
	src, err := accel.TensorSource([]*tensors.Tensor{tensors.FromFlatDataAndDimensions(x, n, 1)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(y, n, 1)})
	if err != nil {
		panic(err) // the shapes above always agree
	}
	return src
}

// weight reads the dense layer's single weight or bias.
func weight(model *accel.Model, name string) float32 {
	v := model.Context().In("line").In("dense").GetVariable(name)
	if v == nil {
		return float32(0)
	}
	value, err := v.Value()
	if err != nil {
		return float32(0)
	}
	return tensors.MustCopyFlatData[float32](value)[0]
}
