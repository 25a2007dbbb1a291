// Package threads holds the number of compute threads this process may use for one operation (its share
// of the node's cores, which cpu.New sets from the ranks on the node) and the workers that operations are
// split over (Split): the kernels in Go split large products, element-wise programs, batch normalization
// and padding into that many parts, and package blas splits OpenBLAS's products the same way.
package threads

import (
	"runtime"
	"sync/atomic"
)

var budget atomic.Int64

// Set sets the budget; n < 1 means GOMAXPROCS.
func Set(n int) { budget.Store(int64(n)) }

// Budget returns the budget: what Set gave, else GOMAXPROCS.
func Budget() int {
	if n := budget.Load(); n > 0 {
		return int(n)
	}
	return runtime.GOMAXPROCS(0)
}
