//go:build blas

package blas

/*
#cgo pkg-config: openblas
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <cblas.h>

// Below about 64 MFLOP a second OpenBLAS thread costs more in wake-up and hand-over than it saves, and on
// a busy node a helper thread that is not scheduled at once stalls the caller (docs/notes.md, Note [one
// BLAS thread for small products]). So small products run on one thread and only large ones use the
// rank's whole budget.
#define GOACCEL_PARALLEL_FLOPS (64.0 * 1024 * 1024)

static int goaccel_max_threads = 1;     // the rank's budget, set by set_max_threads
static int goaccel_current_threads = 1; // what OpenBLAS was last told
// OpenBLAS's thread count is process-wide: changing it and calling gemm must not interleave with another
// goroutine doing the same.
static pthread_mutex_t goaccel_threads_mu = PTHREAD_MUTEX_INITIALIZER;

static void set_max_threads(int threads) {
	pthread_mutex_lock(&goaccel_threads_mu);
	goaccel_max_threads = threads;
	openblas_set_num_threads(threads); // starts the threads now, not on the first large product
	goaccel_current_threads = threads;
	pthread_mutex_unlock(&goaccel_threads_mu);
}

static int max_threads(void) { return goaccel_max_threads; }

// init_threads starts from what OpenBLAS chose when it loaded (OPENBLAS_NUM_THREADS, else the cores).
static void init_threads(void) {
	pthread_mutex_lock(&goaccel_threads_mu);
	goaccel_max_threads = goaccel_current_threads = openblas_get_num_threads();
	pthread_mutex_unlock(&goaccel_threads_mu);
}

static void use_threads_for(int batch, int m, int n, int k) {
	double flops = 2.0 * batch * m * n * k;
	int want = flops >= GOACCEL_PARALLEL_FLOPS ? goaccel_max_threads : 1;
	if (want != goaccel_current_threads) {
		openblas_set_num_threads(want);
		goaccel_current_threads = want;
	}
}

// The batch loop runs in C so a batched DotGeneral costs one cgo call, not one per batch item.

static void sgemm_batched(int batch, int m, int n, int k, int trans_a, int trans_b,
		const float *a, int lda, const int64_t *off_a, const float *b, int ldb, const int64_t *off_b, float *c) {
	pthread_mutex_lock(&goaccel_threads_mu);
	use_threads_for(batch, m, n, k);
	const size_t stride_a = (size_t)m * k, stride_b = (size_t)k * n, stride_c = (size_t)m * n;
	for (int i = 0; i < batch; i++) {
		const float *ai = a + (off_a ? (size_t)off_a[i] : i * stride_a);
		const float *bi = b + (off_b ? (size_t)off_b[i] : i * stride_b);
		cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
			m, n, k, 1.0f, ai, lda, bi, ldb, 0.0f, c + i * stride_c, n);
	}
	pthread_mutex_unlock(&goaccel_threads_mu);
}

static void dgemm_batched(int batch, int m, int n, int k, int trans_a, int trans_b,
		const double *a, int lda, const int64_t *off_a, const double *b, int ldb, const int64_t *off_b, double *c) {
	pthread_mutex_lock(&goaccel_threads_mu);
	use_threads_for(batch, m, n, k);
	const size_t stride_a = (size_t)m * k, stride_b = (size_t)k * n, stride_c = (size_t)m * n;
	for (int i = 0; i < batch; i++) {
		const double *ai = a + (off_a ? (size_t)off_a[i] : i * stride_a);
		const double *bi = b + (off_b ? (size_t)off_b[i] : i * stride_b);
		cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
			m, n, k, 1.0, ai, lda, bi, ldb, 0.0, c + i * stride_c, n);
	}
	pthread_mutex_unlock(&goaccel_threads_mu);
}
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/goaccel/goaccel/cpu/internal/gemmtile"
)

// Built reports whether OpenBLAS is linked in (the `blas` build tag).
const Built = true

// kernelDescription names the OpenBLAS actually loaded (its version and the core it dispatched to), and
// goaccel's own kernel where float32 products run on it instead.
func kernelDescription() string {
	// openblas_get_config returns e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64".
	fields := strings.Fields(C.GoString(C.openblas_get_config()))
	version := "OpenBLAS"
	if len(fields) >= 2 {
		version = fields[0] + " " + fields[1]
	}
	threads := kernelThreads()
	unit := "threads"
	if threads == 1 {
		unit = "thread"
	}
	routines := "cblas_sgemm/dgemm"
	if float32OnTiles {
		routines = "cblas_dgemm; float32 on the AVX-512 micro-kernel"
	}
	return fmt.Sprintf("%s %s (%s), %d %s", version, openblasCore(), routines, threads, unit)
}

// openblasCore is the processor core OpenBLAS dispatched to when it loaded: its own detection, or the core
// OPENBLAS_CORETYPE named.
func openblasCore() string { return C.GoString(C.openblas_get_corename()) }

// float32OnTiles is whether float32 products run on gemmtile's 512-bit tiles instead of OpenBLAS: where
// the processor has AVX-512 but the OpenBLAS loaded runs a 256-bit core (OPENBLAS_CORETYPE, read when the
// library loads, can pin one such as Haswell on any processor), the tiles do twice the multiply-adds per
// instruction. Where OpenBLAS runs an AVX-512 core of its own, it keeps the products: there the two
// measured alike (docs/notes.md, Note [512-bit tiles beside OpenBLAS]).
var float32OnTiles = gemmtile.Wide() && !avx512Core(openblasCore())

// avx512Core reports whether an OpenBLAS core name is one of its AVX-512 cores.
func avx512Core(name string) bool {
	switch strings.ToLower(name) {
	case "skylakex", "cooperlake", "sapphirerapids":
		return true
	}
	return false
}

func init() { C.init_threads() }

// setKernelThreads sets the rank's OpenBLAS thread budget (large products use all of it, small ones one
// thread); OPENBLAS_NUM_THREADS only applies when the library loads.
func setKernelThreads(threads int) { C.set_max_threads(C.int(threads)) }

func kernelThreads() int { return int(C.max_threads()) }

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// sgemmBatched computes the float32 gemms g describes, on the tiles where float32OnTiles says so. The slices' memory holds no Go pointers, so passing
// it to C for the duration of the call follows the cgo pointer rules.
func sgemmBatched(g gemmShape, a, b, c []float32) {
	if float32OnTiles {
		tileGemmBatched(g, a, b, c)
		return
	}
	C.sgemm_batched(C.int(g.batch), C.int(g.m), C.int(g.n), C.int(g.k), cbool(g.transA), cbool(g.transB),
		(*C.float)(&a[0]), C.int(g.lda()), offsetsPointer(g.offA), (*C.float)(&b[0]), C.int(g.ldb()),
		offsetsPointer(g.offB), (*C.float)(&c[0]))
}

// dgemmBatched computes the float64 gemms g describes.
func dgemmBatched(g gemmShape, a, b, c []float64) {
	C.dgemm_batched(C.int(g.batch), C.int(g.m), C.int(g.n), C.int(g.k), cbool(g.transA), cbool(g.transB),
		(*C.double)(&a[0]), C.int(g.lda()), offsetsPointer(g.offA), (*C.double)(&b[0]), C.int(g.ldb()),
		offsetsPointer(g.offB), (*C.double)(&c[0]))
}

// offsetsPointer passes batch item offsets to C as they are (nil: items back to back).
func offsetsPointer(offsets []int64) *C.int64_t {
	if len(offsets) == 0 {
		return nil
	}
	return (*C.int64_t)(unsafe.Pointer(&offsets[0]))
}
