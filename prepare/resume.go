package prepare

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/ml/context"

	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/resume"
)

// The checkpoint hooks live in an internal package so that only goaccel's own SaveState/LoadState can reach
// the accumulators, counters and positions they restore.
func init() {
	resume.Model = resume.ModelHooks{
		Accumulators:        func(m any) []*context.Variable { return m.(*Model).buckets },
		PendingSync:         func(m any) bool { return m.(*Model).synced },
		RestoreAccumulation: func(m any, accumulating bool) { m.(*Model).restoreAccumulation(accumulating) },
	}
	resume.Optimizer = resume.OptimizerHooks{
		Restore: func(o any, steps, skipped int64) { o.(*Optimizer).restore(steps, skipped) },
		Kind:    func(o any) string { return fmt.Sprintf("%T", o.(*Optimizer).optimizer) },
		Describe: func(o any) string {
			opt := o.(*Optimizer)
			return fmt.Sprintf("%s, gradient clipping norm %g, non-finite policy %v", replicas.Describe(opt.optimizer),
				opt.clipNorm, opt.nonFinite)
		},
	}
	resume.Loader = resume.LoaderHooks{
		Restore:  func(l any, epoch, position int) error { return l.(*DataLoader).restore(epoch, position) },
		Peekable: func(l any) bool { return l.(*DataLoader).source != nil },
		CheckRestore: func(l any, epoch, position int) error {
			return l.(*DataLoader).checkRestore(epoch, position)
		},
	}
}

// checkRestore returns the error restore would return for epoch and position, and refuses a negative
// epoch, without changing anything.
func (l *DataLoader) checkRestore(epoch, position int) error {
	if epoch < 0 {
		return fmt.Errorf("prepare: cannot resume in epoch %d: epochs count from 0", epoch)
	}
	if position < 0 {
		return fmt.Errorf("prepare: cannot resume at batch %d: positions count batches from 0", position)
	}
	if l.source != nil && position > l.Len() {
		return fmt.Errorf("prepare: cannot resume at batch %d of an epoch of %d batches", position, l.Len())
	}
	return nil
}
