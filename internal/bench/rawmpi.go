//go:build mpi

package bench

/*
#include <mpi.h>

// The reference all-reduces on its own duplicate of MPI_COMM_WORLD, so its traffic can never be matched
// with goaccel's (whose engine duplicates the world communicator too). Handles are macros over library
// globals in Open MPI, so they stay on the C side.
static MPI_Comm bench_comm;

static int bench_open(void) {
	int flag = 0;
	MPI_Initialized(&flag);
	if (!flag) {
		return -1;
	}
	return MPI_Comm_dup(MPI_COMM_WORLD, &bench_comm);
}

static int bench_close(void) { return MPI_Comm_free(&bench_comm); }

// The loops run entirely in C, one cgo call per sample, so the reference pays no Go cost per operation:
// what it measures is MPI itself, as osu_allreduce does.

static int bench_allreduce(float *buf, int count, int iters) {
	for (int i = 0; i < iters; i++) {
		int rc = MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, bench_comm);
		if (rc != MPI_SUCCESS) {
			return rc;
		}
	}
	return MPI_SUCCESS;
}

// The non-blocking collective goaccel's engine starts, completed by MPI_Wait: it tells the cost of the
// algorithm MPI picks for MPI_Iallreduce apart from the cost of goaccel's side.
static int bench_iallreduce(float *buf, int count, int iters) {
	for (int i = 0; i < iters; i++) {
		MPI_Request req;
		int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, bench_comm, &req);
		if (rc == MPI_SUCCESS) {
			rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
		}
		if (rc != MPI_SUCCESS) {
			return rc;
		}
	}
	return MPI_SUCCESS;
}

static int bench_barrier(void) { return MPI_Barrier(bench_comm); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// rawMPI is the plain-MPI reference: C loops over MPI calls on a buffer goaccel's communicator also uses.
// Its calls are made from one goroutine while no goaccel collective is in flight, which is all
// MPI_THREAD_SERIALIZED (the level goaccel's engine asks for) requires.
type rawMPI struct{}

// openRawMPI duplicates MPI_COMM_WORLD for the reference. MPI must already be initialised (by opening
// goaccel's "mpi" engine), so both share one MPI session. Collective.
func openRawMPI() (rawMPI, error) {
	if rc := C.bench_open(); rc != C.MPI_SUCCESS {
		if rc == -1 {
			return rawMPI{}, fmt.Errorf("bench: MPI is not initialised: open goaccel's mpi engine first")
		}
		return rawMPI{}, fmt.Errorf("bench: MPI_Comm_dup failed with code %d", int(rc))
	}
	return rawMPI{}, nil
}

// allreduce runs iters blocking MPI_Allreduce calls on buf.
func (rawMPI) allreduce(buf []float32, iters int) error {
	// A Go pointer may be passed to C for the duration of a call that does not keep it: every loop
	// completes its collectives before it returns.
	return check("MPI_Allreduce", C.bench_allreduce((*C.float)(unsafe.Pointer(&buf[0])), C.int(len(buf)), C.int(iters)))
}

// iallreduce runs iters MPI_Iallreduce calls on buf, each completed by MPI_Wait.
func (rawMPI) iallreduce(buf []float32, iters int) error {
	return check("MPI_Iallreduce", C.bench_iallreduce((*C.float)(unsafe.Pointer(&buf[0])), C.int(len(buf)), C.int(iters)))
}

func (rawMPI) barrier() error { return check("MPI_Barrier", C.bench_barrier()) }

func (rawMPI) close() error { return check("MPI_Comm_free", C.bench_close()) }

func check(call string, rc C.int) error {
	if rc != C.MPI_SUCCESS {
		return fmt.Errorf("bench: %s failed with code %d", call, int(rc))
	}
	return nil
}
