package computetest

// backendConfig runs a graph's operations one after another, as under the race detector and as cpu.New
// does whenever simplego's own DotGeneral computes: in test binaries without goaccel's matrix products that
// DotGeneral (either of its paths) waits inside a scheduler task for a worker of the pool the parallel
// scheduler has filled, and can wait forever (docs/notes.md, Note [simplego's worker pool]; it hung a
// gradient check in CI twice). The executors' behaviour under the parallel scheduler is tested through
// cpu.New's backend, whose products are goaccel's.
const backendConfig = "ops_sequential"
