//go:build !linux

package backends

import "runtime"

// yieldProcessor lets other goroutines run between polls (sched_yield is Linux-specific).
func yieldProcessor() { runtime.Gosched() }
