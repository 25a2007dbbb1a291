package prepare

import (
	"github.com/gomlx/gomlx/pkg/ml/context"

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
	}
	resume.Loader = resume.LoaderHooks{
		Restore:  func(l any, epoch, position int) error { return l.(*DataLoader).restore(epoch, position) },
		Peekable: func(l any) bool { return l.(*DataLoader).source != nil },
	}
}
