package cpu

import "github.com/goaccel/goaccel/cpu/internal/blas"

// Gemm32 computes the row-major product c = op(a)·op(b) in float32, c of shape [m, n] and the contraction
// of size k, on the matrix kernel this binary links (OpenBLAS with the blas build tag, gonum's otherwise):
// for host-side arithmetic outside graphs, such as PowerSGD's low-rank factors. a is stored as [m, k], or
// [k, m] when transA; b as [k, n], or [n, k] when transB.
func Gemm32(m, n, k int, transA, transB bool, a, b, c []float32) {
	blas.Gemm(m, n, k, transA, transB, a, b, c)
}
