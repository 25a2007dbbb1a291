package cpu_test

import (
	"fmt"

	"github.com/goaccel/goaccel/cpu"
)

// New returns the pure-Go GoMLX backend unless XLA is asked for (or installed).
func ExampleNew() {
	backend, err := cpu.New(cpu.Config{Backend: cpu.PureGo})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(backend.Name())
	// Output: SimpleGo (go)
}

// SetSequentialOps switches the pure-Go backend between its parallel schedule and one operation after
// another; a prepared model does it by itself, timing its first micro-batches both ways.
func ExampleSetSequentialOps() {
	backend, err := cpu.New(cpu.Config{Backend: cpu.PureGo, Threads: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := cpu.SetSequentialOps(backend, true, false); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cpu.CurrentKernels().Ops)
	_ = cpu.SetSequentialOps(backend, false, false)
	fmt.Println(cpu.CurrentKernels().Ops)
	// Output:
	// sequential
	// parallel
}
