//go:build !mpi

package mpi

// LibraryVersion returns the MPI library's version text (MPI_Get_library_version). This binary was built
// without the `mpi` tag, so no MPI library is linked and it returns "".
func LibraryVersion() string { return "" }
