package bench

import (
	"fmt"

	"github.com/goaccel/goaccel/backends"
)

// allReduceResult compares goaccel's all-reduce with plain MPI on one buffer size and world size.
type allReduceResult struct {
	Ranks int
	Bytes int64
	// Raw is the reference, blocking MPI_Allreduce in C; Goaccel is Communicator.AllReduceSum.
	Raw, Goaccel series
	// Iallreduce is MPI_Iallreduce completed by MPI_Wait in C, the collective goaccel's engine starts:
	// against Raw it prices MPI's algorithm for the non-blocking call, against Goaccel what goaccel adds.
	Iallreduce series
}

// busFactor converts algorithm bandwidth into bus bandwidth for an all-reduce over n ranks: each rank
// sends and receives 2(n−1)/n of the buffer in a bandwidth-optimal algorithm (as in nccl-tests).
func busFactor(n int) float64 { return 2 * float64(n-1) / float64(n) }

// measureAllReduce times, for each size, Communicator.AllReduceSum against the plain-MPI loops on the same
// float32 buffer in the same processes. Collective: every rank calls it with the same arguments.
func measureAllReduce(comm *backends.Communicator, raw rawMPI, sizes []int64, t timing) ([]allReduceResult, error) {
	g := group{comm: comm, barrier: raw.barrier, timing: t}
	var out []allReduceResult
	for _, size := range sizes {
		buf := make([]float32, size/4)
		name := func(impl string) string {
			return fmt.Sprintf("AllReduce/impl=%s/size=%s/ranks=%d", impl, formatBytes(size), comm.Size())
		}
		s, err := g.measure(
			variant{name("mpi"), func(iters int) error { return raw.allreduce(buf, iters) }},
			variant{name("goaccel"), func(iters int) error {
				for range iters {
					if err := comm.AllReduceSum(backends.BufferOf(buf)); err != nil {
						return err
					}
				}
				return nil
			}},
			variant{name("mpi-iallreduce"), func(iters int) error { return raw.iallreduce(buf, iters) }},
		)
		if err != nil {
			return nil, fmt.Errorf("all-reduce of %s: %w", formatBytes(size), err)
		}
		for i := range s {
			s[i].Bytes = size
		}
		out = append(out, allReduceResult{Ranks: comm.Size(), Bytes: size, Raw: s[0], Goaccel: s[1], Iallreduce: s[2]})
	}
	return out, nil
}
