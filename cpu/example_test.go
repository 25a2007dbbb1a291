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
