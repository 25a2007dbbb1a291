// Package prepare wraps the user's GoMLX objects for the job's topology: a Model whose backward pass adds
// gradients into bucket accumulators and syncs them when due, an Optimizer that applies synced gradients,
// and a DataLoader that gives each rank its own shard of every epoch.
package prepare

import (
	"fmt"
	"runtime/debug"

	gomlxbackends "github.com/gomlx/gomlx/backends"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
)

// Runtime is what prepared objects share: the compute backend, the communicator, the gradient state and
// the bucket settings. The Accelerator builds one; tests may build their own.
type Runtime struct {
	Backend gomlxbackends.Backend
	Comm    *backends.Communicator
	State   *accumulate.GradientState

	FirstBucketBytes int64
	BucketCapBytes   int64

	// CommHook carries gradient buckets between ranks (nil: accumulate.IdentityHook), and Sharding decides
	// which rank holds which part of the synchronised gradients (nil: accumulate.Replicated). See the
	// reducer in package accumulate.
	CommHook accumulate.CommHook
	Sharding accumulate.Sharding
	// Overlap starts each bucket's sync inside the training step, as soon as the backward pass has
	// produced the bucket, on a micro-batch that syncs under Replicated with more than one process, where
	// the compute backend can (the pure-Go backend with goaccel's kernels; elsewhere the sync follows the
	// step as without it). The sums are the same bit for bit. See docs/overlap.md.
	Overlap bool
}

func (rt *Runtime) commHook() accumulate.CommHook {
	if rt.CommHook == nil {
		return accumulate.IdentityHook{}
	}
	return rt.CommHook
}

// sendsFP16 reports whether gradient buckets travel as fp16, whose range ends at ±65504.
func (rt *Runtime) sendsFP16() bool {
	h, ok := rt.CommHook.(*accumulate.CompressionHook)
	return ok && h.Format() == accumulate.FP16 && rt.Comm != nil && rt.Comm.Size() > 1
}

// defaultNonFinite is the optimizers' policy for non-finite synced gradients unless OnNonFinite says:
// refuse the step where fp16 on the wire can overflow, else apply it as GoMLX does.
func (rt *Runtime) defaultNonFinite() NonFinitePolicy {
	if rt.sendsFP16() {
		return NonFiniteFail
	}
	return NonFiniteApply
}

// sharding is the strategy the job's models use: Replicated when none was set, and on one process, where
// there is nothing to split (a checkpoint records it so).
func (rt *Runtime) sharding() accumulate.Sharding {
	if rt.Sharding == nil || rt.Comm.Size() == 1 {
		return accumulate.Replicated{}
	}
	return rt.Sharding
}

// checkOpen refuses what to run once the runtime's communicator was closed (the Accelerator's Close).
func (rt *Runtime) checkOpen(what string) error {
	if rt.Comm.Closed() {
		return fmt.Errorf("prepare: %s after the accelerator was closed: %w", what, backends.ErrClosed)
	}
	return nil
}

func (rt *Runtime) validate() error {
	switch {
	case rt == nil:
		return fmt.Errorf("prepare: nil runtime")
	case rt.Backend == nil:
		return fmt.Errorf("prepare: runtime has no compute backend")
	case rt.Comm == nil:
		return fmt.Errorf("prepare: runtime has no communicator")
	case rt.State == nil:
		return fmt.Errorf("prepare: runtime has no gradient state")
	}
	if rt.BucketCapBytes <= 0 {
		rt.BucketCapBytes = accumulate.DefaultBucketCapBytes
	}
	if rt.FirstBucketBytes <= 0 {
		rt.FirstBucketBytes = accumulate.DefaultFirstBucketBytes
	}
	return nil
}

// recovered turns a panic raised while GoMLX builds or runs a graph into an error: graph-building code in
// GoMLX (and in user model functions) reports misuse by panicking, and a library must not crash its caller.
func recovered(what string, err *error) {
	if r := recover(); r != nil {
		if e, ok := r.(error); ok {
			*err = fmt.Errorf("%s: %w", what, e)
		} else {
			*err = fmt.Errorf("%s: %v", what, r)
		}
		if debugPanics {
			*err = fmt.Errorf("%w\n%s", *err, debug.Stack())
		}
	}
}

// debugPanics adds stack traces to recovered panics (set by tests when chasing a failure).
var debugPanics = false
