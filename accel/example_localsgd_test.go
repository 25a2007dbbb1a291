package accel_test

import (
	"fmt"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// WithLocalSGD: each process steps on its own gradients, and the parameters are averaged after every H-th
// optimizer step. Here 8 examples in batches of 2 give 4 steps: with H=2, two averages and no gradient
// all-reduce. (On one process an average changes nothing; on N, one all-reduce per parameter bucket.)
func ExampleWithLocalSGD() {
	acc, err := accel.New(accel.WithBackend("go"), accel.WithLocalSGD(2))
	if err != nil {
		panic(err)
	}
	defer acc.Close()
	err = exampleLoop(acc, 8, func(model *accel.Model, opt *accel.Optimizer) error { return nil })
	if err != nil {
		panic(err)
	}
	stats := acc.Stats()
	fmt.Println(stats.Mode)
	fmt.Println("optimizer steps:", stats.OptimizerSteps, "averages:", stats.ParameterAverages,
		"gradient syncs:", stats.Syncs)
	// Output:
	// local SGD (H=2)
	// optimizer steps: 4 averages: 2 gradient syncs: 0
}

// WithDiLoCo: every H inner steps the outer optimizer steps θ_outer along the pseudo-gradient θ_outer −
// mean(θ_local) with Nesterov momentum, and every process continues from the new θ_outer. With an outer
// learning rate of 1 and no momentum that is local SGD; the paper's 0.7 and 0.9 go further along the
// averaged update once momentum builds up.
func ExampleWithDiLoCo() {
	for _, outer := range [][2]float64{{1, 0}, {accel.DefaultOuterLearningRate, accel.DefaultOuterMomentum}} {
		acc, err := accel.New(accel.WithBackend("go"), accel.WithDiLoCo(2, outer[0], outer[1]))
		if err != nil {
			panic(err)
		}
		var model *accel.Model
		err = exampleLoop(acc, 8, func(m *accel.Model, opt *accel.Optimizer) error { model = m; return nil })
		if err != nil {
			panic(err)
		}
		w, err := testmodel.FlatFloat64(model.Parameters()[0])
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: w = (%.4f, %.4f)\n", acc.Stats().Mode, w[0], w[1])
		_ = acc.Close()
	}
	// Output:
	// DiLoCo (H=2, outer lr 1, momentum 0): w = (0.0599, 0.0332)
	// DiLoCo (H=2, outer lr 0.7, momentum 0.9): w = (0.0784, 0.1073)
}
