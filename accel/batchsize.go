package accel

import (
	"errors"
	"fmt"
	"strings"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/prepare"
)

// FindExecutableBatchSize runs fn with the largest batch size per process, from start down by halves, that
// fits in memory, and returns it (Accelerate's find_executable_batch_size). fn builds what depends on the
// batch size — the loader, usually the model and optimizer too — and trains; an error matching
// ErrOutOfMemory (errors.Is) is a refusal: goaccel refuses a model whose estimated need for one micro-batch
// does not fit when it is built (Materialize, or the first Backward), before anything is allocated, so a
// refused size costs a graph build, not a crash. Any other error ends the search at once and is returned.
//
// Sizes the estimate of a refusal shows cannot fit are skipped without calling fn: the next size tried is
// the largest half that the estimate, scaled to the batch, leaves room for on every process.
//
// Collective: every process calls it with its own start, and all use the same size, the smallest any
// process asks for, since one process may have less memory than another; the refusal of one process is
// the refusal of all. fn must return on every process at the same point: goaccel's memory check is
// collective, so a refused model is refused on every process together. What fn prepared on the accelerator
// in a refused attempt (models, optimizers, loaders) is dropped before the next, so that checkpoints and
// the processes' settings hold only the attempt that ran. The main process prints one line with the size
// found.
func FindExecutableBatchSize(acc *Accelerator, start int, fn func(batchSize int) error) (int, error) {
	if err := acc.checkOpen(); err != nil {
		return 0, err
	}
	switch {
	case fn == nil:
		return 0, errors.New("accel: FindExecutableBatchSize: the function is nil")
	case start < 1:
		return 0, fmt.Errorf("accel: FindExecutableBatchSize: the batch size to start from must be at least 1, got %d",
			start)
	}
	starts, err := acc.exchangeInts(batchFits, start)
	if err != nil {
		return 0, fmt.Errorf("accel: FindExecutableBatchSize: %w", err)
	}
	size := start
	for _, s := range starts {
		size = min(size, int(s[1]))
	}
	first := size
	var refused, skipped []int
	for {
		mark := acc.markPrepared()
		err := fn(size)
		status, next := batchFits, size/2
		if errors.Is(err, prepare.ErrOutOfMemory) {
			status = batchRefused
			var refusal *prepare.MemoryError
			if errors.As(err, &refusal) {
				for next >= 1 && !refusal.Fits(next) {
					next /= 2
				}
			}
		} else if err != nil {
			status = batchFailed
		}
		outcomes, xerr := acc.exchangeInts(status, next)
		if xerr != nil {
			return 0, errors.Join(err, fmt.Errorf("accel: FindExecutableBatchSize: %w", xerr))
		}
		worst, worstRank := batchFits, 0
		for r, o := range outcomes {
			if o[0] > worst {
				worst, worstRank = o[0], r
			}
			next = min(next, int(o[1]))
		}
		switch worst {
		case batchFits:
			acc.Printf("goaccel: batch size %d per process fits%s\n", size, searchNote(refused, skipped))
			return size, nil
		case batchFailed:
			if status == batchFailed {
				return 0, err
			}
			return 0, fmt.Errorf("accel: FindExecutableBatchSize: process %d failed at batch size %d; its error "+
				"is in its output", worstRank, size)
		}
		acc.rollBack(mark)
		refused = append(refused, size)
		for s := size / 2; s > next && s >= 1; s /= 2 {
			skipped = append(skipped, s)
		}
		if next < 1 {
			if err == nil {
				err = prepare.ErrOutOfMemory
			}
			return 0, fmt.Errorf("accel: FindExecutableBatchSize: no batch size from %d down to 1 fits in memory "+
				"(refused on process %d): %w", first, worstRank, err)
		}
		size = next
	}
}

// The outcomes of one attempt, ordered: the processes act on the worst.
const (
	batchFits int64 = iota
	batchRefused
	batchFailed
)

// exchangeInts gathers a pair of numbers from every process, ordered by rank.
func (a *Accelerator) exchangeInts(x int64, y int) ([][2]int64, error) {
	if a.comm.Size() == 1 {
		return [][2]int64{{x, int64(y)}}, nil
	}
	all := make([]int64, 2*a.comm.Size())
	if err := a.comm.AllGather(backends.BufferOf([]int64{x, int64(y)}), backends.BufferOf(all)); err != nil {
		return nil, err
	}
	pairs := make([][2]int64, a.comm.Size())
	for r := range pairs {
		pairs[r] = [2]int64{all[2*r], all[2*r+1]}
	}
	return pairs, nil
}

// preparedMark is what the accelerator held before an attempt.
type preparedMark struct {
	models, optimizers, loaders int
	settingsAgreed              bool
	position                    accumulate.Position
}

func (a *Accelerator) markPrepared() preparedMark {
	return preparedMark{len(a.models), len(a.optimizers), len(a.loaders), a.settingsAgreed, a.state.Position()}
}

// rollBack forgets what a refused attempt prepared: the next attempt's objects replace them, and settings,
// checkpoints and the accumulation cycle are those of the attempt that runs.
func (a *Accelerator) rollBack(m preparedMark) {
	clear(a.models[m.models:])
	clear(a.optimizers[m.optimizers:])
	clear(a.loaders[m.loaders:])
	a.models, a.optimizers, a.loaders = a.models[:m.models], a.optimizers[:m.optimizers], a.loaders[:m.loaders]
	a.settingsAgreed = m.settingsAgreed
	_ = a.state.Restore(m.position) // a position the state itself gave
}

func searchNote(refused, skipped []int) string {
	list := func(sizes []int) string {
		s := make([]string, len(sizes))
		for i, n := range sizes {
			s[i] = fmt.Sprint(n)
		}
		return strings.Join(s, ", ")
	}
	var parts []string
	if len(refused) > 0 {
		parts = append(parts, "refused for memory: "+list(refused))
	}
	if len(skipped) > 0 {
		parts = append(parts, "skipped by the memory estimate: "+list(skipped))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}
