package compute_test

import (
	"fmt"

	"github.com/goaccel/goaccel/backends/compute"
)

// New returns the pure-Go GoMLX backend unless XLA is asked for (or installed).
func ExampleNew() {
	backend, err := compute.New(compute.Config{Backend: compute.PureGo})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(backend.Name())
	// Output: SimpleGo (go)
}
