//go:build blas

package blas

/*
#cgo pkg-config: openblas
#include <stddef.h>
#include <stdint.h>
#include <cblas.h>

// OpenBLAS itself always runs on the calling thread: its own worker threads spin (sched_yield) for a long
// timeout after each threaded product, and on a node whose cores the ranks share exactly that spinning
// took a core from the graph's other operations (a ResNet step on one process of 2 cores ran slower with
// 2 threads than with 1). Large products are split in Go instead (sgemmBatched), each part a
// single-threaded call on its own goroutine, and nothing waits while idle (the rank's budget for that
// split is maxThreads, in Go).
//
// That needs OpenBLAS's pthreads build (Debian's default), in which concurrent single-threaded calls are
// safe. Its OpenMP build takes its thread count from the calling OS thread's OpenMP setting and its serial
// build may not lock its buffers: with either, calls are serialised under a mutex and never split
// (concurrent_calls).
// concurrent_calls reports whether the loaded OpenBLAS is the pthreads build (openblas_get_parallel: 0
// serial, 1 pthreads, 2 OpenMP).
static int concurrent_calls(void) { return openblas_get_parallel() == 1; }

// init_threads returns what OpenBLAS chose when it loaded (OPENBLAS_NUM_THREADS, else the cores), the
// budget to start from, and makes OpenBLAS's own calls single-threaded.
static int init_threads(void) {
	int threads = openblas_get_num_threads();
	openblas_set_num_threads(1);
	return threads;
}

// The batch loop runs in C so a batched DotGeneral costs one cgo call, not one per batch item. Each call
// computes rows m0 to m1 of every item's C (all of them: 0 to m); A's row i starts i·lda elements in, or i
// when A is transposed, and C's row i·ldc elements into the item.

static void sgemm_rows(int batch, int m0, int m1, int m, int n, int k, int trans_a, int trans_b,
		const float *a, int lda, const int64_t *off_a, const float *b, int ldb, const int64_t *off_b, float *c, int ldc,
		const int64_t *off_c) {
	const size_t stride_a = (size_t)m * k, stride_b = (size_t)k * n, stride_c = (size_t)m * n;
	const size_t row_a = trans_a ? 1 : (size_t)lda;
	for (int i = 0; i < batch; i++) {
		const float *ai = a + (off_a ? (size_t)off_a[i] : i * stride_a) + m0 * row_a;
		const float *bi = b + (off_b ? (size_t)off_b[i] : i * stride_b);
		cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
			m1 - m0, n, k, 1.0f, ai, lda, bi, ldb, 0.0f, c + (off_c ? (size_t)off_c[i] : i * stride_c) + (size_t)m0 * ldc, ldc);
	}
}

static void dgemm_rows(int batch, int m0, int m1, int m, int n, int k, int trans_a, int trans_b,
		const double *a, int lda, const int64_t *off_a, const double *b, int ldb, const int64_t *off_b, double *c, int ldc,
		const int64_t *off_c) {
	const size_t stride_a = (size_t)m * k, stride_b = (size_t)k * n, stride_c = (size_t)m * n;
	const size_t row_a = trans_a ? 1 : (size_t)lda;
	for (int i = 0; i < batch; i++) {
		const double *ai = a + (off_a ? (size_t)off_a[i] : i * stride_a) + m0 * row_a;
		const double *bi = b + (off_b ? (size_t)off_b[i] : i * stride_b);
		cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
			m1 - m0, n, k, 1.0, ai, lda, bi, ldb, 0.0, c + (off_c ? (size_t)off_c[i] : i * stride_c) + (size_t)m0 * ldc, ldc);
	}
}
*/
import "C"

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/goaccel/goaccel/cpu/internal/gemmtile"
	"github.com/goaccel/goaccel/cpu/internal/threads"
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
	switch {
	case float32OnTiles:
		routines = "cblas_dgemm; float32 on the AVX-512 micro-kernel"
	case smallPlainOnTiles:
		routines = "cblas_sgemm/dgemm; plain float32 products with a B of up to 512 KB and weights gradients with a " +
			"larger one on the AVX-512 micro-kernel"
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

// tilesBeatOpenBLAS reports whether the tiles run g faster than OpenBLAS even where OpenBLAS runs an AVX-512
// core: one item, A not transposed, at least 64 rows, and a B that fits in 512 KB, which the tiles stream
// from the core's cache for every six rows without packing it, where OpenBLAS packs both operands on every
// call; a B stored transposed only when it has at most 128 columns and the product at least 1024 rows, which
// pay for copying it into order; A transposed (a weights gradient) when B is larger than 512 KB, which the
// tiles sum in runs that stay in cache (gemmtile.SumsInRuns). With a larger B and A in order, a smaller one
// and A transposed, or a batch of small products OpenBLAS was as fast or faster (docs/notes.md, Note
// [512-bit tiles beside OpenBLAS]).
func tilesBeatOpenBLAS(g gemmShape) bool {
	if !smallPlainOnTiles || g.batch != 1 {
		return false
	}
	if g.transA {
		// A weights gradient whose B overflows L2: the tiles sum it in runs that keep B in cache.
		return !g.transB && gemmtile.SumsInRuns(g.m, g.n, g.k)
	}
	if g.transB {
		// Transposed into a scratch copy first: worth it over many rows, for a B of a few columns.
		return g.m >= 1024 && g.n <= 128 && g.k*g.n <= 64<<10
	}
	return g.m >= 64 && g.k*g.n <= 128<<10
}

// smallPlainOnTiles is whether tilesBeatOpenBLAS may send products to the tiles (plain ones with a small
// B, weights gradients with a large one): where the processor has AVX-512. A variable so that tests can
// hold every product on OpenBLAS.
var smallPlainOnTiles = gemmtile.Wide()

// avx512Core reports whether an OpenBLAS core name is one of its AVX-512 cores.
func avx512Core(name string) bool {
	switch strings.ToLower(name) {
	case "skylakex", "cooperlake", "sapphirerapids":
		return true
	}
	return false
}

// maxThreads is the rank's budget for splitting a product.
var maxThreads atomic.Int64

func init() { maxThreads.Store(int64(C.init_threads())) }

// setKernelThreads sets the rank's thread budget for products: a large one is split over that many
// goroutines, each part a single-threaded OpenBLAS call; small ones run on the caller.
func setKernelThreads(threads int) { maxThreads.Store(int64(threads)) }

func kernelThreads() int { return int(maxThreads.Load()) }

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// sgemmBatched computes the float32 gemms g describes, on the tiles where float32OnTiles says so. The
// slices' memory holds no Go pointers, so passing it to C for the duration of the call follows the cgo
// pointer rules.
func sgemmBatched(g gemmShape, a, b, c []float32) {
	if onTiles(g) {
		tileGemmBatched(g, a, b, c)
		return
	}
	sgemmBatchedOpenBLAS(g, a, b, c)
}

// onTiles reports whether sgemmBatched runs g on the tiles (else on OpenBLAS).
func onTiles(g gemmShape) bool {
	return tilesReach(g) && (float32OnTiles || tilesBeatOpenBLAS(g))
}

// sgemmBatchedOpenBLAS is sgemmBatched on OpenBLAS whatever the processor.
func sgemmBatchedOpenBLAS(g gemmShape, a, b, c []float32) {
	forRowParts(g, func(m0, m1 int) {
		C.sgemm_rows(C.int(g.batch), C.int(m0), C.int(m1), C.int(g.m), C.int(g.n), C.int(g.k), cbool(g.transA),
			cbool(g.transB), (*C.float)(&a[0]), C.int(g.lda()), offsetsPointer(g.offA), (*C.float)(&b[0]),
			C.int(g.ldb()), offsetsPointer(g.offB), (*C.float)(&c[0]), C.int(g.ldc()), offsetsPointer(g.offC))
	})
}

// dgemmBatched computes the float64 gemms g describes.
func dgemmBatched(g gemmShape, a, b, c []float64) {
	forRowParts(g, func(m0, m1 int) {
		C.dgemm_rows(C.int(g.batch), C.int(m0), C.int(m1), C.int(g.m), C.int(g.n), C.int(g.k), cbool(g.transA),
			cbool(g.transB), (*C.double)(&a[0]), C.int(g.lda()), offsetsPointer(g.offA), (*C.double)(&b[0]),
			C.int(g.ldb()), offsetsPointer(g.offB), (*C.double)(&c[0]), C.int(g.ldc()), offsetsPointer(g.offC))
	})
}

// offsetsPointer passes batch item offsets to C as they are (nil: items back to back).
func offsetsPointer(offsets []int64) *C.int64_t {
	if len(offsets) == 0 {
		return nil
	}
	return (*C.int64_t)(unsafe.Pointer(&offsets[0]))
}

// parallelFlops is the work of a batched product from which it is split over the rank's threads: below
// it a second goroutine's hand-over costs more than the split saves. A variable so that tests can split
// small products.
var parallelFlops = float64(gemmtile.ParallelFlops)

// concurrentCalls is whether OpenBLAS may be called from several threads at once (its pthreads build);
// serialCalls serialises the calls where it may not.
var (
	concurrentCalls = C.concurrent_calls() != 0
	serialCalls     sync.Mutex
)

// forRowParts calls part with row ranges [m0, m1) that together cover g's m rows: one range on the calling
// goroutine, or, for a large product, one per thread of the budget, run at once.
func forRowParts(g gemmShape, part func(m0, m1 int)) {
	if !concurrentCalls {
		serialCalls.Lock()
		defer serialCalls.Unlock()
		part(0, g.m)
		return
	}
	workers := min(kernelThreads(), g.m)
	if 2*float64(g.batch)*float64(g.m)*float64(g.n)*float64(g.k) < parallelFlops {
		workers = 1
	}
	if workers <= 1 {
		part(0, g.m)
		return
	}
	threads.Split(workers, func(w int) { part(g.m*w/workers, g.m*(w+1)/workers) })
}
