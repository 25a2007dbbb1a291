//go:build !mpi

package bench

import "errors"

// rawMPI would run the plain-MPI reference loops; binaries built without -tags mpi have none.
type rawMPI struct{}

func openRawMPI() (rawMPI, error) {
	return rawMPI{}, errors.New("bench: the plain-MPI reference needs a binary built with -tags mpi")
}

func (rawMPI) allreduce([]float32, int) error  { return nil }
func (rawMPI) iallreduce([]float32, int) error { return nil }
func (rawMPI) barrier() error                  { return nil }
func (rawMPI) close() error                    { return nil }
