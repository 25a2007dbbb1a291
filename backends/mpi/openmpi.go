//go:build mpi && !mpich

package mpi

// Open MPI ships pkg-config files; ompi-c carries the include path and -lmpi (for Debian/Ubuntu:
// apt-get install libopenmpi-dev openmpi-bin).

// #cgo pkg-config: ompi-c
import "C"
