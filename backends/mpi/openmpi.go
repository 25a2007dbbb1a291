//go:build mpi && !mpich

package mpi

// Open MPI ships pkg-config files; ompi-c carries the include path and -lmpi (for Debian/Ubuntu:
// apt-get install libopenmpi-dev openmpi-bin).

// #cgo pkg-config: ompi-c
import "C"

import "os"

// libnbcIallreduceAlgorithm is Open MPI's MCA variable choosing MPI_Iallreduce's algorithm. Open MPI 4.1
// picks a binomial tree (the whole buffer reduced to one rank, then broadcast back) for in-place calls or
// fewer than 4 ranks, and goaccel's bucket all-reduces are always in place, which costs much of the
// bandwidth of large all-reduces (docs/notes.md, Note [in-place iallreduce algorithm]). The ring (1)
// handles in-place buffers and moves 2(N-1)/N of the buffer per rank, as MPI_Allreduce's algorithms do.
const libnbcIallreduceAlgorithm = "OMPI_MCA_coll_libnbc_iallreduce_algorithm"

// libraryDefaults sets goaccel's defaults for the MPI library before MPI_Init reads its environment; a
// value the user (or mpirun -mca) already set wins.
func libraryDefaults() {
	if _, set := os.LookupEnv(libnbcIallreduceAlgorithm); !set {
		_ = os.Setenv(libnbcIallreduceAlgorithm, "1")
	}
}
