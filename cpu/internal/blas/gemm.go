package blas

// Gemm computes the row-major product c = op(a)·op(b), c of shape [m, n] and the contraction of size k, on
// the kernel this binary links (OpenBLAS with the blas build tag, gonum's gemm without), whether or not
// Install routed simplego's DotGeneral to it. a is stored as [m, k], or [k, m] when transA; b as [k, n], or
// [n, k] when transB. Other compute paths (convolutions) call it on buffers they packed themselves.
func Gemm[T float32 | float64](m, n, k int, transA, transB bool, a, b, c []T) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		clear(c[:m*n])
		return
	}
	shape := gemmShape{batch: 1, m: m, n: n, k: k, transA: transA, transB: transB}
	switch c := any(c).(type) {
	case []float32:
		sgemmBatched(shape, any(a).([]float32), any(b).([]float32), c)
	case []float64:
		dgemmBatched(shape, any(a).([]float64), any(b).([]float64), c)
	}
}

// TransposeInto copies src, of dimensions srcDims, into dst with its axes permuted: dst axis i is src axis
// permutation[i]. Axes that stay adjacent move as blocks, and a transpose of the two innermost axes is
// walked in cache-sized tiles.
func TransposeInto[T any](dst, src []T, srcDims, permutation []int) {
	transposeInto(dst, src, srcDims, permutation)
}
