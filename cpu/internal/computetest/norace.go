//go:build !race

package computetest

// backendConfig keeps simplego's default scheduling, operations in parallel when one graph executes alone,
// the way the executors under test run in training, but sends every DotGeneral simplego itself computes
// (in test binaries without goaccel's matrix products) down its large-matrix path: the small-matrix path
// waits for a worker of the pool the parallel scheduler has filled, and can wait forever (docs/notes.md,
// Note [simplego's worker pool]; it hung a gradient check in CI). In training that DotGeneral is goaccel's.
const backendConfig = "dotgeneral_large"
