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
// rows k apart and its elements 1 apart, or the other way round when transposed), B in place unless
// transposed (then copied into [k, n] first, the kernel's order).
func tileGemmBatched(g gemmShape, a, b, c []float32) {
	rowStarts, offsets := make([]int, g.m), make([]int32, g.k)
	for i := range rowStarts {
		rowStarts[i] = i * pick(g.transA, 1, g.k)
	}
	for k := range offsets {
		offsets[k] = int32(k * pick(g.transA, g.m, 1))
	}
	strideA, strideB, strideC := g.m*g.k, g.k*g.n, g.m*g.n
	var transposed []float32
	if g.transB {
		transposed = make([]float32, strideB)
	}
	for i := range g.batch {
		bi := b[i*strideB : (i+1)*strideB]
		if g.transB {
			transposeInto(transposed, bi, []int{g.n, g.k}, []int{1, 0})
			bi = transposed
		}
		gemmtile.Product{A: a[i*strideA : (i+1)*strideA], RowStarts: rowStarts, Offsets: offsets, B: bi, LDB: g.n,
			N: g.n, C: c[i*strideC : (i+1)*strideC], LDC: g.n}.Run(threads.Budget())
	}
}

// dgemmBatched computes the float64 gemms g describes, one gonum Dgemm per batch item.
func dgemmBatched(g gemmShape, a, b, c []float64) {
	gemmBatched(g, a, b, c, gonum.Implementation{}.Dgemm)
}

// gemmBatched runs gemm (gonum's Sgemm or Dgemm) once per batch item of g.
func gemmBatched[T float32 | float64](g gemmShape, a, b, c []T, gemm func(tA, tB gonumblas.Transpose,
	m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int)) {
	strideA, strideB, strideC := g.m*g.k, g.k*g.n, g.m*g.n
	for i := range g.batch {
		gemm(transposeFlag(g.transA), transposeFlag(g.transB), g.m, g.n, g.k,
			1, a[i*strideA:(i+1)*strideA], g.lda(), b[i*strideB:(i+1)*strideB], g.ldb(),
			0, c[i*strideC:(i+1)*strideC], g.ldc())
	}
}
