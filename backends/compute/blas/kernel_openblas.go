//go:build blas

package blas

/*
#cgo pkg-config: openblas
#include <stddef.h>
#include <cblas.h>

// The batch loop runs in C so a batched DotGeneral costs one cgo call, not one per batch item.

static void sgemm_batched(int batch, int m, int n, int k, int trans_a, int trans_b,
		const float *a, const float *b, float *c) {
	const int lda = trans_a ? m : k, ldb = trans_b ? k : n;
	const size_t stride_a = (size_t)m * k, stride_b = (size_t)k * n, stride_c = (size_t)m * n;
	for (int i = 0; i < batch; i++) {
		cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
			m, n, k, 1.0f, a + i * stride_a, lda, b + i * stride_b, ldb, 0.0f, c + i * stride_c, n);
	}
}

static void dgemm_batched(int batch, int m, int n, int k, int trans_a, int trans_b,
		const double *a, const double *b, double *c) {
	const int lda = trans_a ? m : k, ldb = trans_b ? k : n;
	const size_t stride_a = (size_t)m * k, stride_b = (size_t)k * n, stride_c = (size_t)m * n;
	for (int i = 0; i < batch; i++) {
		cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
			m, n, k, 1.0, a + i * stride_a, lda, b + i * stride_b, ldb, 0.0, c + i * stride_c, n);
	}
}
*/
import "C"

import (
	"fmt"
	"strings"
)

// Built reports whether OpenBLAS is linked in (the `blas` build tag).
const Built = true

// kernelDescription names the OpenBLAS actually loaded (its version and the core it dispatched to).
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
	return fmt.Sprintf("%s %s (cblas_sgemm/dgemm), %d %s", version, C.GoString(C.openblas_get_corename()),
		threads, unit)
}

// setKernelThreads sets OpenBLAS's thread count; OPENBLAS_NUM_THREADS only applies when the library loads.
func setKernelThreads(threads int) { C.openblas_set_num_threads(C.int(threads)) }

func kernelThreads() int { return int(C.openblas_get_num_threads()) }

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// sgemmBatched computes the float32 gemms g describes. The slices' memory holds no Go pointers, so passing
// it to C for the duration of the call follows the cgo pointer rules.
func sgemmBatched(g gemmShape, a, b, c []float32) {
	C.sgemm_batched(C.int(g.batch), C.int(g.m), C.int(g.n), C.int(g.k), cbool(g.transA), cbool(g.transB),
		(*C.float)(&a[0]), (*C.float)(&b[0]), (*C.float)(&c[0]))
}

// dgemmBatched computes the float64 gemms g describes.
func dgemmBatched(g gemmShape, a, b, c []float64) {
	C.dgemm_batched(C.int(g.batch), C.int(g.m), C.int(g.n), C.int(g.k), cbool(g.transA), cbool(g.transB),
		(*C.double)(&a[0]), (*C.double)(&b[0]), (*C.double)(&c[0]))
}
