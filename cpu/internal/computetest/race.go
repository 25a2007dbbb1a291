//go:build race

package computetest

// backendConfig runs a graph's operations one after another under the race detector, as cpu.New does:
// simplego's parallel scheduler races on its own bookkeeping (docs/notes.md, Note [simplego's parallel
// scheduler]), which would hide the races of the executors under test.
const backendConfig = "ops_sequential"
