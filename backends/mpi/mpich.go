//go:build mpi && mpich

package mpi

// MPICH installs mpich.pc (for Debian/Ubuntu: apt-get install libmpich-dev mpich). The binding keeps to the
// MPI-3 standard API, so the same code compiles against either library's headers.

// #cgo pkg-config: mpich
import "C"

// libraryDefaults: MPICH's MPI_Iallreduce already chooses bandwidth-optimal algorithms for large buffers.
func libraryDefaults() {}
