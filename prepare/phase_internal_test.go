package prepare

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestPhasePacking(t *testing.T) {
	for _, p := range []Phase{
		{},
		{Kind: PhaseBackward, Index: 471, Syncs: true},
		{Kind: PhaseOptimizerStep, Index: 12},
		{Kind: PhaseLoad, Index: 1 << 40},
		{Kind: PhaseAllGather, Index: 1},
	} {
		assert.Equal(t, p, unpackPhase(p.pack()))
	}
}

// TestPhasesCostNoAllocation: without an observer a phase is two atomic stores; with one, the observer's
// own work.
func TestPhasesCostNoAllocation(t *testing.T) {
	rt := &Runtime{}
	assert.Zero(t, testing.AllocsPerRun(1000, func() { rt.endPhase(rt.beginPhase(PhaseBackward, 3, true)) }))
	assert.Zero(t, testing.AllocsPerRun(1000, func() { _ = rt.inPhase(PhaseUpdate, 3, func() error { return nil }) }))
	var n int
	rt.SetPhaseObserver(func(Phase, time.Time, time.Time) { n++ })
	assert.Zero(t, testing.AllocsPerRun(1000, func() { rt.endPhase(rt.beginPhase(PhaseBackward, 3, true)) }))
	assert.Positive(t, n)
}

// TestNestedPhases: a phase ends back in the one it interrupted, and the observer hears of the inner one
// first, with the outer one current again.
func TestNestedPhases(t *testing.T) {
	rt := &Runtime{}
	var heard []Phase
	var currentThen []Phase
	rt.SetPhaseObserver(func(p Phase, begin, end time.Time) {
		heard = append(heard, p)
		currentThen = append(currentThen, rt.Phase())
		assert.False(t, end.Before(begin))
	})
	outer := rt.beginPhase(PhaseOptimizerStep, 5, false)
	assert.Equal(t, Phase{Kind: PhaseOptimizerStep, Index: 5}, rt.Phase())
	assert.NoError(t, rt.inPhase(PhaseRefresh, 5, func() error {
		assert.Equal(t, Phase{Kind: PhaseRefresh, Index: 5}, rt.Phase())
		return nil
	}))
	rt.endPhase(outer)
	assert.Equal(t, Phase{}, rt.Phase())
	assert.Equal(t, []Phase{{Kind: PhaseRefresh, Index: 5}, {Kind: PhaseOptimizerStep, Index: 5}}, heard)
	assert.Equal(t, []Phase{{Kind: PhaseOptimizerStep, Index: 5}, {}}, currentThen)
}
