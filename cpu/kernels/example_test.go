package kernels_test

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/graph"

	"github.com/goaccel/goaccel/cpu"
	_ "github.com/goaccel/goaccel/cpu/kernels" // the kernels, which make cpu.MarkReady work
)

// With goaccel's kernels, a graph of the pure-Go backend hands a marked value to the program while it
// executes, in the memory it outputs: what a training step uses to start a bucket's all-reduce before its
// backward pass ends.
func Example_markReady() {
	backend, err := cpu.New(cpu.Config{Backend: cpu.PureGo + ":ops_sequential"})
	if err != nil {
		fmt.Println(err)
		return
	}
	exec, err := graph.NewExec(backend, func(x *graph.Node) *graph.Node {
		loss := graph.ReduceAllSum(x)
		doubled, marked := cpu.MarkReady(graph.MulScalar(x, 2), loss, 0, func(flat any, loss float64) {
			fmt.Println("handed over:", flat, "loss:", loss)
		})
		fmt.Println("marked:", marked)
		return graph.Neg(doubled)
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("output:", exec.MustExec([]float32{1, 2, 3})[0])
	// Output:
	// marked: true
	// handed over: [2 4 6] loss: 6
	// output: [3]float32{-2, -4, -6}
}
