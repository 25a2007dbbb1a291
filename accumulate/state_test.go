package accumulate_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
)

func newState(t *testing.T, k int, syncEachBatch bool) *accumulate.GradientState {
	t.Helper()
	s, err := accumulate.NewGradientState(k, syncEachBatch)
	require.NoError(t, err)
	return s
}

// snapshot is everything observable about a state between calls.
type snapshot struct {
	SyncGradients, InAccumulate, EndOfDataloader bool
	StepInCycle, MicroBatches                    int
	Scale, Correction                            float64
	Position                                     accumulate.Position
}

func snap(s *accumulate.GradientState) snapshot {
	return snapshot{SyncGradients: s.SyncGradients(), InAccumulate: s.InAccumulate(),
		EndOfDataloader: s.EndOfDataloader(), StepInCycle: s.StepInCycle(), MicroBatches: s.MicroBatchesSinceSync(),
		Scale: s.MicroBatchScale(), Correction: s.SyncCorrection(), Position: s.Position()}
}

// accumulateCalls runs calls Accumulate calls, marking the ones listed in ends as end-of-dataloader, and
// returns for each call whether it synced (as seen inside fn).
func accumulateCalls(t *testing.T, s *accumulate.GradientState, calls int, ends map[int]bool) []bool {
	t.Helper()
	synced := make([]bool, calls)
	for i := range calls {
		s.SetEndOfDataloader(ends[i+1])
		require.NoError(t, s.Accumulate(func() error {
			synced[i] = s.SyncGradients()
			return nil
		}))
	}
	s.SetEndOfDataloader(false)
	return synced
}

// pattern turns "..S." into []bool{false, false, true, false}.
func pattern(p string) []bool {
	out := make([]bool, len(p))
	for i, c := range p {
		out[i] = c == 'S'
	}
	return out
}

func TestNewGradientState(t *testing.T) {
	for _, k := range []int{0, -1, -10} {
		_, err := accumulate.NewGradientState(k, false)
		require.Error(t, err, "K=%d", k)
		assert.Contains(t, err.Error(), "at least 1")
	}
	s := newState(t, 3, true)
	assert.Equal(t, 3, s.Steps())
	assert.True(t, s.SyncEachBatch())
	assert.False(t, newState(t, 3, false).SyncEachBatch())
}

func TestOutsideAccumulateEveryStepSyncs(t *testing.T) {
	s := newState(t, 4, false)
	for range 5 {
		assert.True(t, s.SyncGradients())
		assert.False(t, s.InAccumulate())
		assert.Equal(t, 1.0, s.MicroBatchScale())
		assert.Zero(t, s.StepInCycle())
	}
}

func TestNoSync(t *testing.T) {
	sentinel := errors.New("from fn")
	tests := []struct {
		name string
		run  func(t *testing.T, s *accumulate.GradientState) error
	}{
		{name: "plain", run: func(t *testing.T, s *accumulate.GradientState) error {
			return s.NoSync(func() error {
				assert.False(t, s.SyncGradients())
				return nil
			})
		}},
		{name: "nested", run: func(t *testing.T, s *accumulate.GradientState) error {
			return s.NoSync(func() error {
				assert.False(t, s.SyncGradients())
				require.NoError(t, s.NoSync(func() error {
					assert.False(t, s.SyncGradients())
					return nil
				}))
				assert.False(t, s.SyncGradients(), "leaving the inner NoSync must not re-enable sync")
				return nil
			})
		}},
		{name: "inside Accumulate on the K-th call", run: func(t *testing.T, s *accumulate.GradientState) error {
			for range s.Steps() - 1 {
				require.NoError(t, s.Accumulate(func() error { return nil }))
			}
			return s.Accumulate(func() error {
				assert.True(t, s.SyncGradients(), "the K-th call syncs outside NoSync")
				require.NoError(t, s.NoSync(func() error {
					assert.False(t, s.SyncGradients())
					assert.Equal(t, 1/float64(s.Steps()), s.MicroBatchScale())
					return nil
				}))
				assert.True(t, s.SyncGradients())
				return nil
			})
		}},
		{name: "inside Accumulate with SyncEachBatch and end of dataloader", run: func(t *testing.T, s *accumulate.GradientState) error {
			s.SetEndOfDataloader(true)
			defer s.SetEndOfDataloader(false)
			return s.Accumulate(func() error {
				assert.True(t, s.ReduceThisStep())
				return s.NoSync(func() error {
					assert.False(t, s.SyncGradients())
					assert.False(t, s.ReduceThisStep(), "NoSync wins over SyncEachBatch")
					return nil
				})
			})
		}},
		{name: "error is returned", run: func(t *testing.T, s *accumulate.GradientState) error {
			err := s.NoSync(func() error { return sentinel })
			assert.ErrorIs(t, err, sentinel)
			return nil
		}},
		{name: "panic leaves NoSync", run: func(t *testing.T, s *accumulate.GradientState) error {
			assert.Panics(t, func() { _ = s.NoSync(func() error { panic("boom") }) })
			return nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newState(t, 3, tc.name == "inside Accumulate with SyncEachBatch and end of dataloader")
			require.NoError(t, tc.run(t, s))
			assert.True(t, s.SyncGradients(), "outside NoSync, sync is on again")
			assert.False(t, s.InAccumulate())
		})
	}
}

func TestAccumulateSyncPattern(t *testing.T) {
	tests := []struct {
		name          string
		k             int
		syncEachBatch bool
		ends          map[int]bool // 1-based calls at which the loader is at its last batch
		want          string
	}{
		{name: "K=1", k: 1, want: "SSSSS"},
		{name: "K=2", k: 2, want: ".S.S.S.S"},
		{name: "K=3", k: 3, want: "..S..S..S.."},
		{name: "K=4", k: 4, want: "...S...S...S"},
		{name: "K=4 end of dataloader on call 6", k: 4, ends: map[int]bool{6: true}, want: "...S.S"},
		{name: "K=4 end of dataloader resets the cycle", k: 4, ends: map[int]bool{2: true}, want: ".S...S...S"},
		{name: "K=4 end of dataloader on a K-th call", k: 4, ends: map[int]bool{4: true}, want: "...S...S"},
		{name: "K=3 two epochs of 5 batches", k: 3, ends: map[int]bool{5: true, 10: true}, want: "..S.S..S.S"},
		{name: "K=1 end of dataloader", k: 1, ends: map[int]bool{2: true}, want: "SSS"},
		{name: "SyncEachBatch steps every K-th", k: 4, syncEachBatch: true, want: "...S.."},
		{name: "SyncEachBatch with end of dataloader", k: 4, syncEachBatch: true, ends: map[int]bool{3: true}, want: "..S."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newState(t, tc.k, tc.syncEachBatch)
			want := pattern(tc.want)
			stepInCycle := 0
			for i := range want {
				s.SetEndOfDataloader(tc.ends[i+1])
				require.NoError(t, s.Accumulate(func() error {
					stepInCycle++
					assert.True(t, s.InAccumulate())
					assert.Equal(t, stepInCycle, s.StepInCycle(), "call %d", i+1)
					assert.Equal(t, want[i], s.SyncGradients(), "call %d", i+1)
					assert.Equal(t, want[i] || tc.syncEachBatch, s.ReduceThisStep(), "call %d all-reduces", i+1)
					assert.Equal(t, 1/float64(tc.k), s.MicroBatchScale())
					return nil
				}))
				if want[i] {
					stepInCycle = 0
				}
				assert.Equal(t, stepInCycle, s.StepInCycle(), "after call %d", i+1)
				assert.False(t, s.InAccumulate())
				assert.True(t, s.SyncGradients(), "outside Accumulate every step syncs")
				assert.Equal(t, 1.0, s.MicroBatchScale())
			}
		})
	}
}

func TestNestedAccumulate(t *testing.T) {
	s := newState(t, 3, false)
	require.NoError(t, s.Accumulate(func() error { return nil }))
	ran := false
	require.NoError(t, s.Accumulate(func() error {
		before := snap(s)
		err := s.Accumulate(func() error {
			ran = true
			return nil
		})
		assert.ErrorIs(t, err, accumulate.ErrNestedAccumulate)
		assert.Equal(t, before, snap(s), "a rejected nested Accumulate must not change the state")
		return nil
	}))
	assert.False(t, ran, "the nested fn must not run")
	assert.Equal(t, 2, s.StepInCycle(), "the outer calls count, the nested one does not")
	assert.Equal(t, pattern("S.."), accumulateCalls(t, s, 3, nil), "the cycle goes on where it was")
}

func TestAccumulateErrorStillAdvances(t *testing.T) {
	sentinel := errors.New("backward failed")
	tests := []struct {
		name   string
		k      int
		ends   map[int]bool
		failAt map[int]bool
		want   string
	}{
		{name: "error on a non-syncing call", k: 3, failAt: map[int]bool{1: true}, want: "..S..S"},
		{name: "error on the K-th call", k: 3, failAt: map[int]bool{3: true}, want: "..S..S"},
		{name: "errors everywhere", k: 2, failAt: map[int]bool{1: true, 2: true, 3: true, 4: true}, want: ".S.S"},
		{name: "error on the last batch", k: 4, ends: map[int]bool{3: true}, failAt: map[int]bool{3: true},
			want: "..S...S"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newState(t, tc.k, false)
			want := pattern(tc.want)
			for i := range want {
				s.SetEndOfDataloader(tc.ends[i+1])
				var synced bool
				err := s.Accumulate(func() error {
					synced = s.SyncGradients()
					if tc.failAt[i+1] {
						return sentinel
					}
					return nil
				})
				if tc.failAt[i+1] {
					assert.ErrorIs(t, err, sentinel, "call %d", i+1)
				} else {
					assert.NoError(t, err, "call %d", i+1)
				}
				assert.Equal(t, want[i], synced, "call %d", i+1)
				assert.False(t, s.InAccumulate(), "call %d", i+1)
			}
		})
	}
}

func TestAccumulatePanicLeavesAccumulate(t *testing.T) {
	s := newState(t, 2, false)
	assert.PanicsWithValue(t, "boom", func() { _ = s.Accumulate(func() error { panic("boom") }) })
	assert.False(t, s.InAccumulate())
	assert.True(t, s.SyncGradients())
	assert.Equal(t, 1, s.StepInCycle(), "the panicking call counted as a micro-batch")
	assert.Equal(t, pattern("S.S"), accumulateCalls(t, s, 3, nil))
}

// TestSyncCorrection drives the state as the prepared model does: every micro-batch is recorded with the
// scale it was added with, and a sync reads the correction and resets the count.
func TestSyncCorrection(t *testing.T) {
	tests := []struct {
		name           string
		k              int
		scaled         int     // micro-batches recorded inside Accumulate at MicroBatchScale
		unscaled       int     // micro-batches recorded outside Accumulate (scale 1)
		outsideScale   float64 // if set, the unscaled ones use this scale instead
		userScale      float64 // if set, the scaled ones use this scale instead, inside Accumulate
		wantCorrection float64
	}{
		{name: "nothing recorded", k: 4, wantCorrection: 1},
		{name: "short cycle of 1", k: 4, scaled: 1, wantCorrection: 4},
		{name: "short cycle of 2", k: 4, scaled: 2, wantCorrection: 2},
		{name: "short cycle of 3", k: 4, scaled: 3, wantCorrection: 4.0 / 3},
		{name: "full cycle", k: 4, scaled: 4, wantCorrection: 1},
		{name: "more than K", k: 4, scaled: 6, wantCorrection: 1},
		{name: "K=1", k: 1, scaled: 1, wantCorrection: 1},
		{name: "mixed scaling", k: 4, scaled: 2, unscaled: 1, wantCorrection: 1},
		{name: "only unscaled", k: 4, unscaled: 2, wantCorrection: 1},
		{name: "user-scaled inside Accumulate", k: 4, scaled: 2, userScale: 0.5, wantCorrection: 1},
		// The manual NoSync pattern: the user scales by 1/K themselves, outside Accumulate.
		{name: "user-scaled 1/K outside Accumulate", k: 4, unscaled: 2, outsideScale: 0.25, wantCorrection: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newState(t, tc.k, false)
			for range tc.unscaled {
				scale := s.MicroBatchScale()
				if tc.outsideScale != 0 {
					scale = tc.outsideScale
				}
				s.RecordMicroBatch(scale)
			}
			for range tc.scaled {
				require.NoError(t, s.Accumulate(func() error {
					scale := s.MicroBatchScale()
					if tc.userScale != 0 {
						scale = tc.userScale
					}
					s.RecordMicroBatch(scale)
					return nil
				}))
			}
			assert.Equal(t, tc.scaled+tc.unscaled, s.MicroBatchesSinceSync())
			assert.InDelta(t, tc.wantCorrection, s.SyncCorrection(), 1e-15)
			s.ResetMicroBatches()
			assert.Zero(t, s.MicroBatchesSinceSync())
			assert.Equal(t, 1.0, s.SyncCorrection())
		})
	}
}

// TestShortFinalCycle: K=4 and a loader of 6 batches. The 4th batch syncs a full cycle; the 6th syncs
// because the loader ends, with 2 micro-batches at 1/4 that must be scaled by 4/2 to become their mean.
func TestShortFinalCycle(t *testing.T) {
	s := newState(t, 4, false)
	var corrections []float64
	var syncs []int
	for i := 1; i <= 6; i++ {
		s.SetEndOfDataloader(i == 6)
		require.NoError(t, s.Accumulate(func() error {
			s.RecordMicroBatch(s.MicroBatchScale())
			if s.SyncGradients() {
				syncs = append(syncs, i)
				corrections = append(corrections, s.SyncCorrection())
				s.ResetMicroBatches()
			}
			return nil
		}))
	}
	assert.Equal(t, []int{4, 6}, syncs)
	assert.Equal(t, []float64{1, 2}, corrections)
}

func TestPositionRestore(t *testing.T) {
	const k = 4
	original := newState(t, k, false)
	for range 2 {
		require.NoError(t, original.Accumulate(func() error {
			original.RecordMicroBatch(original.MicroBatchScale())
			return nil
		}))
	}
	original.RecordMicroBatch(1) // one more, outside Accumulate
	pos := original.Position()
	assert.Equal(t, accumulate.Position{StepInCycle: 2, ScaledMicroBatches: 2, UnscaledMicroBatches: 1}, pos)

	data, err := json.Marshal(pos)
	require.NoError(t, err)
	assert.JSONEq(t, `{"step_in_cycle":2,"scaled_micro_batches":2,"unscaled_micro_batches":1}`, string(data))
	var decoded accumulate.Position
	require.NoError(t, json.Unmarshal(data, &decoded))

	restored := newState(t, k, false)
	require.NoError(t, restored.Restore(decoded))
	assert.Equal(t, pos, restored.Position())
	assert.Equal(t, original.StepInCycle(), restored.StepInCycle())
	assert.Equal(t, original.MicroBatchesSinceSync(), restored.MicroBatchesSinceSync())
	assert.Equal(t, original.SyncCorrection(), restored.SyncCorrection())
	assert.Equal(t, pattern(".S...S"), accumulateCalls(t, restored, 6, nil), "the restored cycle syncs after K-2 more calls")
	assert.Equal(t, pattern(".S...S"), accumulateCalls(t, original, 6, nil))

	t.Run("rejects out of range", func(t *testing.T) {
		valid := accumulate.Position{StepInCycle: 1, ScaledMicroBatches: 1}
		for _, bad := range []accumulate.Position{
			{StepInCycle: -1},
			{StepInCycle: k},
			{StepInCycle: k + 3},
			{StepInCycle: 0, ScaledMicroBatches: -1},
			{StepInCycle: 0, UnscaledMicroBatches: -1},
		} {
			s := newState(t, k, false)
			require.NoError(t, s.Restore(valid))
			err := s.Restore(bad)
			require.Error(t, err, "%+v", bad)
			assert.Contains(t, err.Error(), "K=4")
			assert.Equal(t, valid, s.Position(), "a rejected Restore must not change the state")
		}
	})
}

// TestNestedLoaders: an inner loader (an evaluation loop inside the training loop) decides the
// end-of-dataloader flag only while it runs; leaving it gives the outer loader its own flag back, so the
// training loader's last micro-batch still syncs (K=2 over 3 batches: .SS).
func TestNestedLoaders(t *testing.T) {
	s := newState(t, 2, false)
	outer, inner := namedLoader{"train", 3}, namedLoader{"eval", 1}
	assert.Nil(t, s.ActiveLoader())
	assert.Equal(t, -1, s.Remainder())
	exitOuter := s.EnterLoader(outer, 1)
	var synced []bool
	for i := range 3 {
		s.SetEndOfDataloader(i == 2)
		// The evaluation loop runs before Accumulate, and ends at its own last batch.
		exitInner := s.EnterLoader(inner, 0)
		assert.Equal(t, inner, s.ActiveLoader())
		assert.Equal(t, 0, s.Remainder())
		assert.False(t, s.EndOfDataloader(), "a new loader starts at its first batch")
		s.SetEndOfDataloader(true)
		exitInner()
		assert.Equal(t, outer, s.ActiveLoader())
		assert.Equal(t, 1, s.Remainder())
		assert.Equal(t, i == 2, s.EndOfDataloader(), "batch %d: the outer loader's flag is back", i)
		require.NoError(t, s.Accumulate(func() error {
			synced = append(synced, s.SyncGradients())
			return nil
		}))
	}
	exitOuter()
	assert.Equal(t, pattern(".SS"), synced)
	assert.Nil(t, s.ActiveLoader())
	assert.False(t, s.EndOfDataloader())
	assert.Zero(t, s.StepInCycle(), "no micro-batch leaks into the next epoch")
}

// TestPositionInsideTheSyncingCall: a checkpoint taken inside the Accumulate call that syncs (after the
// optimizer's step) resumes at the next cycle's start; inside a call that does not sync, at the call after.
func TestPositionInsideTheSyncingCall(t *testing.T) {
	s := newState(t, 2, false)
	var positions []int
	for range 2 {
		require.NoError(t, s.Accumulate(func() error {
			positions = append(positions, s.Position().StepInCycle)
			return nil
		}))
	}
	assert.Equal(t, []int{1, 0}, positions)
	require.NoError(t, newState(t, 2, false).CheckPosition(s.Position()))
}

// namedLoader is a loader of n batches known by its name.
type namedLoader struct {
	name string
	n    int
}

func (l namedLoader) Len() int       { return l.n }
func (l namedLoader) String() string { return l.name }
