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

	// MemoryLimit, when positive, is the most memory in bytes this process counts on: a model whose
	// estimated need is more is refused (ErrOutOfMemory), as it is when the machine or a cgroup has less.
	// It leaves room for what else runs in the process or on the machine.
	MemoryLimit int64

	// CommHook carries gradient buckets between ranks (nil: accumulate.IdentityHook), and Sharding decides
	// which rank holds which part of the synchronised gradients (nil: accumulate.Replicated). See the
	// reducer in package accumulate.
	CommHook accumulate.CommHook
	Sharding accumulate.Sharding

	// phases records what the prepared objects are doing (Phase, SetPhaseObserver).
	phases phases
	// LocalSGD, when set, makes each process step on its own gradients and average the parameters every
	// LocalSGD.Steps optimizer steps (local SGD, or DiLoCo with an outer optimizer); see LocalSGD.
	LocalSGD *LocalSGD
	// Overlap starts each bucket's sync inside the training step, as soon as the backward pass has
	// produced the bucket, on a micro-batch that syncs under Replicated with more than one process, where
	// the compute backend can (the pure-Go backend with goaccel's kernels; elsewhere the sync follows the
	// step as without it). The sums are the same bit for bit. See docs/overlap.md.
	Overlap bool
	// MeasureOpsSchedule, when set, switches the compute backend between running a graph's operations in
	// parallel (sequential false) and one after another; the runtime's first training micro-batches measure
	// both and keep the faster (measured true for that last call). See opsschedule.go.
	MeasureOpsSchedule func(sequential, measured bool) error

	// tuner is the measurement MeasureOpsSchedule drives, made with the first micro-batch.
	tuner *opsTuner
}

// opsTuner returns the runtime's schedule measurement, nil when there is none to make.
func (rt *Runtime) opsTuner() *opsTuner {
	if rt.tuner == nil && rt.MeasureOpsSchedule != nil {
		rt.tuner = &opsTuner{set: rt.MeasureOpsSchedule}
	}
	return rt.tuner
}

// local reports whether the models of this runtime train on local gradients (LocalSGD).
func (rt *Runtime) local() bool { return rt.LocalSGD != nil }

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
	if rt.LocalSGD != nil {
		if err := rt.LocalSGD.Validate(); err != nil {
			return err
		}
		if rt.Sharding != nil && rt.Sharding.Stage() > 0 {
			return fmt.Errorf("prepare: %s averages whole parameters on every process, and the %s sharding strategy "+
				"keeps only a block of them and of the optimizer state on each: use replicated sharding",
				rt.LocalSGD, rt.Sharding.Name())
		}
		if _, ok := rt.CommHook.(*accumulate.CompressionHook); ok {
			return fmt.Errorf("prepare: %s sends no gradients, and the parameters it averages travel in their own "+
				"dtype: gradient compression does not apply to it", rt.LocalSGD)
		}
		if rt.State.SyncEachBatch() {
			return fmt.Errorf("prepare: %s all-reduces no gradients, and sync-each-batch all-reduces every "+
				"micro-batch's: use one or the other", rt.LocalSGD)
		}
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
