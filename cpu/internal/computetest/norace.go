//go:build !race

package computetest

// backendConfig is simplego's default: operations in parallel when one graph executes alone, the way the
// executors under test run in training.
const backendConfig = ""
