package bench

// RawKind names a plain-MPI reference loop.
type RawKind int

// The reference loops. Each runs entirely in C, one cgo call per sample.
const (
	// RawAllreduce is the reference of issue 5: blocking MPI_Allreduce, as osu_allreduce measures it.
	RawAllreduce RawKind = iota
	// RawIallreduceWait is MPI_Iallreduce completed by MPI_Wait: the collective goaccel's engine starts,
	// with MPI's own (blocking) progress. It separates the cost of the non-blocking algorithm from the
	// cost of goaccel's wait loop.
	RawIallreduceWait
	// RawIallreduceTest is MPI_Iallreduce completed by polling MPI_Test in a C loop: the way goaccel
	// completes a collective, without the Go side of each poll.
	RawIallreduceTest
)

func (k RawKind) String() string {
	switch k {
	case RawAllreduce:
		return "MPI_Allreduce"
	case RawIallreduceWait:
		return "MPI_Iallreduce+Wait"
	case RawIallreduceTest:
		return "MPI_Iallreduce+Test"
	}
	return "unknown"
}

// RawMPI runs the plain-MPI reference loops on the ranks of the job that goaccel's mpi engine joined.
// Binaries built without -tags mpi have none (see OpenRawMPI).
type RawMPI interface {
	run(kind RawKind, buf []float32, iters int) error
	barrier() error
	Close() error
}

// OpenRawMPI opens the plain-MPI reference. MPI must already be initialised by goaccel's mpi engine.
// Collective.
func OpenRawMPI() (RawMPI, error) { return openRawMPI() }
