package mpi_test

import (
	"fmt"
	"strings"

	"github.com/goaccel/goaccel/backends/mpi"
)

// LibraryVersion names the MPI library linked in (it does not initialise MPI), or returns "" in a binary
// built without -tags mpi. `accel env` prints it.
func ExampleLibraryVersion() {
	if v := mpi.LibraryVersion(); v != "" {
		fmt.Println("linked:", strings.SplitN(v, ",", 2)[0]) // for example "Open MPI v4.1.4"
	} else {
		fmt.Println("built without -tags mpi")
	}
}
