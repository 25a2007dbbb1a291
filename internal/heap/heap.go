// Package heap gives the memory of a finished setup phase back to Go's heap at once.
package heap

import "runtime"

// Settle runs two garbage collections, for the end of a phase that leaves a whole model's worth of buffers
// behind: materialising a model (every rank's own initial values, overwritten by rank 0's; sharded, the
// replicated copies that the blocks were cut from) or loading a checkpoint (the payload every rank
// received and the values it replaced).
//
// Two, because the pure-Go backend keeps freed buffers in sync.Pools: a collection moves a pool's contents
// to its victim cache, where they still count as live, and only the next one frees them. Go sets its next
// collection's goal at twice the heap live after the last (GOGC=100), so without this the goal follows the
// setup's transient peak, and the heap, and the process's resident memory, grow to it during training
// instead of staying near what training keeps. DeepSpeed collects after partitioning for the same reason.
// It costs milliseconds, once per phase: the heap is mostly large pointer-free buffers, which the
// collector does not scan.
func Settle() {
	runtime.GC()
	runtime.GC()
}
