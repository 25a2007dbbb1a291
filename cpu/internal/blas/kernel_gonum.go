//go:build !blas

package blas

import (
	"runtime"

	"github.com/goaccel/goaccel/cpu/internal/gemmtile"

	gonumblas "gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// Built reports whether OpenBLAS is linked in (the `blas` build tag). Without it, float32 products run on
// gemmtile's AVX2/FMA micro-kernel (its 512-bit tiles with AVX-512) where the processor has them, and
// otherwise (and for float64) on gonum's pure-Go gemm, still several times faster than simplego's own
// DotGeneral.
const Built = false

func kernelDescription() string {
	switch {
	case gemmtile.Wide():
		return "pure Go (AVX-512 micro-kernel; gonum for float64)"
	case gemmtile.Accelerated():
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
	if onTiles(g) {
		tileGemmBatched(g, a, b, c)
		return
	}
	gemmBatched(g, a, b, c, gonum.Implementation{}.Sgemm)
}

// onTiles reports whether sgemmBatched runs g on the tiles (else on gonum).
func onTiles(g gemmShape) bool { return gemmtile.Accelerated() && tilesReach(g) }

// dgemmBatched computes the float64 gemms g describes, one gonum Dgemm per batch item.
func dgemmBatched(g gemmShape, a, b, c []float64) {
	gemmBatched(g, a, b, c, gonum.Implementation{}.Dgemm)
}

// gemmBatched runs gemm (gonum's Sgemm or Dgemm) once per batch item of g.
func gemmBatched[T float32 | float64](g gemmShape, a, b, c []T, gemm func(tA, tB gonumblas.Transpose,
	m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int)) {
	for i := range g.batch {
		gemm(transposeFlag(g.transA), transposeFlag(g.transB), g.m, g.n, g.k,
			1, a[g.startA(i):], g.lda(), b[g.startB(i):], g.ldb(),
			0, c[g.startC(i):], g.ldc())
	}
}
