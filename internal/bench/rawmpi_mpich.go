//go:build mpi && mpich

package bench

// #cgo pkg-config: mpich
import "C"
