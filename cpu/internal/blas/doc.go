// Package blas makes GoMLX's pure-Go backend ("go", package simplego) multiply matrices with a tuned gemm
// kernel: OpenBLAS's cblas_sgemm/cblas_dgemm when built with the `blas` build tag, gonum's pure-Go gemm
// otherwise.
//
// simplego's own DotGeneral kernel runs at a few GFLOP/s, which makes matrix products dominate a training
// step on CPU; OpenBLAS runs the same shapes an order of magnitude faster, and even gonum's pure-Go gemm is
// several times faster. graph.Dot and dense layers are built on DotGeneral, so routing that one op covers
// them.
//
// simplego has no exported way to replace an op's executor, so Install patches two of its internals, both
// checked before use and pinned to GoMLX v0.26.0 by this package's tests:
//
//   - simplego's executor table (the package-level arrays nodeExecutors and nodeExecutorsPriority), pulled
//     in with //go:linkname: Install swaps the DotGeneral entry for this package's executor at simplego's
//     user priority and keeps the original one, which Uninstall restores and which still runs every
//     DotGeneral the gemm kernel does not cover.
//   - the DotGeneral axes, which simplego keeps in an unexported struct in the node's unexported data field:
//     their names, types and offsets are checked with reflect, then read with unsafe.
//
// Two small upstream APIs would retire both patches: an exported executor-registration hook in simplego
// (e.g. RegisterNodeExecutor(opType, priority, fn) with exported Node/Buffer accessors), and an accessor
// for a DotGeneral node's contracting and batch axes.
//
// Coverage: float32 and float64 DotGenerals of any layout. Layouts where each operand, viewed as
// [batch, rows, contracting] or [batch, contracting, rows], is already a row-major gemm operand (batch axes
// leading and in order, contracting axes contiguous and either trailing or right after the batch axes) run
// straight from the operands' memory; other layouts first copy the operand that does not fit into gemm
// order, which costs one pass over it. Other dtypes run on simplego's own kernel. Calls reports how many
// DotGenerals took each path.
package blas
