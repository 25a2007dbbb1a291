//go:build mpi

package mpi_test

import (
	"fmt"

	"github.com/goaccel/goaccel/backends"
	_ "github.com/goaccel/goaccel/backends/mpi"
)

// A program opens the engine for the topology its launcher describes. Started without a launcher, as
// here, MPI runs as a singleton: a world of one rank.
func Example() {
	topo, err := backends.DetectTopology()
	if err != nil {
		panic(err)
	}
	comm, err := backends.Open("mpi", topo)
	if err != nil {
		panic(err)
	}
	grads := []float32{0.5, -1, 2}
	if err := comm.AllReduceSum(backends.BufferOf(grads)); err != nil {
		panic(err)
	}
	fmt.Println(comm.Name(), comm.Rank(), comm.Size(), grads)
	if err := comm.Close(); err != nil {
		panic(err)
	}
	// Output: mpi 0 1 [0.5 -1 2]
}
