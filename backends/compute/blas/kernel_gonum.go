//go:build !blas

package blas

import (
	"runtime"

	"github.com/goaccel/goaccel/backends/compute/internal/gemmtile"
	"github.com/goaccel/goaccel/backends/compute/internal/threads"

	gonumblas "gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// Built reports whether OpenBLAS is linked in (the `blas` build tag). Without it, float32 products run on
// gemmtile's AVX2/FMA micro-kernel where the processor has them, and otherwise (and for float64) on gonum's
// pure-Go gemm, still several times faster than simplego's own DotGeneral.
const Built = false

func kernelDescription() string {
	if gemmtile.Accelerated() {
		return "pure Go (AVX2/FMA micro-kernel; gonum for float64)"
	}
	return "pure Go (gonum)"
}

// setKernelThreads is a no-op: gonum's gemm parallelizes over GOMAXPROCS and has no thread setting.
func setKernelThreads(int) {}

func kernelThreads() int { return runtime.GOMAXPROCS(0) }

func transposeFlag(trans bool) gonumblas.Transpose {
	if trans {
		return gonumblas.Trans
	}
	return gonumblas.NoTrans
}

// sgemmBatched computes the float32 gemms g describes: on gemmtile's kernel where it runs, else one gonum
// Sgemm per batch item.
func sgemmBatched(g gemmShape, a, b, c []float32) {
	if gemmtile.Accelerated() {
		tileGemmBatched(g, a, b, c)
		return
	}
	gemmBatched(g, a, b, c, gonum.Implementation{}.Sgemm)
}

// tileGemmBatched runs each batch item of g as a gemmtile.Product: A read in place through offsets (its
// rows lda apart and its elements 1 apart, or the other way round when transposed), B in place unless
// transposed (then copied into [k, n] first, the kernel's order).
func tileGemmBatched(g gemmShape, a, b, c []float32) {
	lda, ldb := g.lda(), g.ldb()
	rowStarts, offsets := make([]int, g.m), make([]int32, g.k)
	for i := range rowStarts {
		rowStarts[i] = i * pick(g.transA, 1, lda)
	}
	for k := range offsets {
		offsets[k] = int32(k * pick(g.transA, lda, 1))
	}
	strideC := g.m * g.n
	var transposed []float32
	if g.transB {
		transposed = make([]float32, g.k*g.n)
	}
	for i := range g.batch {
		bi, ldbi := b[g.startB(i):], ldb
		if g.transB {
			transposeRows(transposed, bi, g.n, g.k, ldb)
			bi, ldbi = transposed, g.n
		}
		gemmtile.Product{A: a[g.startA(i):], RowStarts: rowStarts, Offsets: offsets, B: bi, LDB: ldbi,
			N: g.n, C: c[i*strideC : (i+1)*strideC], LDC: g.n}.Run(threads.Budget())
	}
}

// transposeRows copies src, rows rows of cols elements ld apart, into dst as [cols, rows].
func transposeRows(dst, src []float32, rows, cols, ld int) {
	if ld == cols {
		transposeInto(dst, src[:rows*cols], []int{rows, cols}, []int{1, 0})
		return
	}
	for r := range rows {
		for c, v := range src[r*ld : r*ld+cols] {
			dst[c*rows+r] = v
		}
	}
}

// dgemmBatched computes the float64 gemms g describes, one gonum Dgemm per batch item.
func dgemmBatched(g gemmShape, a, b, c []float64) {
	gemmBatched(g, a, b, c, gonum.Implementation{}.Dgemm)
}

// gemmBatched runs gemm (gonum's Sgemm or Dgemm) once per batch item of g.
func gemmBatched[T float32 | float64](g gemmShape, a, b, c []T, gemm func(tA, tB gonumblas.Transpose,
	m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int)) {
	strideC := g.m * g.n
	for i := range g.batch {
		gemm(transposeFlag(g.transA), transposeFlag(g.transB), g.m, g.n, g.k,
			1, a[g.startA(i):], g.lda(), b[g.startB(i):], g.ldb(),
			0, c[i*strideC:(i+1)*strideC], g.ldc())
	}
}
