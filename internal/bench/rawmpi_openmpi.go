//go:build mpi && !mpich

package bench

// The reference links the same MPI library as goaccel's engine (see backends/mpi/openmpi.go).

// #cgo pkg-config: ompi-c
import "C"
