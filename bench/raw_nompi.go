//go:build !mpi

package bench

import "errors"

func openRawMPI() (RawMPI, error) {
	return nil, errors.New("bench: the plain-MPI reference needs a binary built with -tags mpi")
}
