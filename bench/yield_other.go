//go:build !linux

package bench

import "runtime"

// schedYield falls back to yielding to other goroutines where sched_yield is not at hand.
func schedYield() { runtime.Gosched() }
