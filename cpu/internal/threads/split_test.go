package threads

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// calls runs Split(n, …) and returns how often each part was called.
func calls(n int) []int32 {
	counts := make([]atomic.Int32, max(n, 0))
	Split(n, func(part int) { counts[part].Add(1) })
	got := make([]int32, len(counts))
	for i := range counts {
		got[i] = counts[i].Load()
	}
	return got
}

func ones(n int) []int32 {
	want := make([]int32, n)
	for i := range want {
		want[i] = 1
	}
	return want
}

// TestSplitCallsEveryPartOnce checks that every part runs exactly once, with budgets below, at and above
// the number of parts, and after the workers have gone to sleep.
func TestSplitCallsEveryPartOnce(t *testing.T) {
	defer Set(0)
	for _, tc := range []struct {
		budget, parts int
		pause         time.Duration
	}{
		{budget: 1, parts: 0},
		{budget: 1, parts: 1},
		{budget: 1, parts: 4},
		{budget: 2, parts: 2},
		{budget: 2, parts: 5},
		{budget: 4, parts: 3},
		{budget: 4, parts: 4},
		{budget: 8, parts: 16},
		{budget: 2, parts: 2, pause: 3 * spinWindow}, // the worker sleeps in between and is woken
		{budget: 4, parts: 4, pause: 3 * spinWindow},
	} {
		t.Run(fmt.Sprintf("budget %d, %d parts, pause %v", tc.budget, tc.parts, tc.pause), func(t *testing.T) {
			Set(tc.budget)
			for range 50 {
				require.Equal(t, ones(tc.parts), calls(tc.parts))
				time.Sleep(tc.pause)
			}
		})
	}
}

// TestSplitRunsPartsAtOnce checks that parts handed to workers run concurrently with the caller's: part 0
// waits for part 1 to start, which only a second goroutine can do.
func TestSplitRunsPartsAtOnce(t *testing.T) {
	defer Set(0)
	Set(2)
	for i := range 20 {
		started := make(chan struct{})
		Split(2, func(part int) {
			if part == 1 {
				close(started)
				return
			}
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				panic("part 1 never ran beside part 0")
			}
		})
		if i%2 == 1 {
			time.Sleep(3 * spinWindow) // let the worker sleep, so the next Split wakes it
		}
	}
}

// TestSplitConcurrentAndNested calls Split from many goroutines at once, each part splitting again: parts
// that find every worker busy run on their caller, and nothing is lost or run twice.
func TestSplitConcurrentAndNested(t *testing.T) {
	defer Set(0)
	Set(4)
	const callers, outer, inner = 8, 3, 5
	var total atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range 100 {
				Split(outer, func(int) {
					Split(inner, func(int) { total.Add(1) })
				})
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, callers*100*outer*inner, total.Load())
}

// BenchmarkSplit measures one fork and join of two parts with a serial stretch between calls, as
// operations of a step come: Split against a fresh goroutine and a WaitGroup. With an idle second core
// the WaitGroup pays its wake-up each time.
func BenchmarkSplit(b *testing.B) {
	defer Set(0)
	Set(2)
	work := func(n int) float64 {
		s := 0.0
		for i := range n {
			s += float64(i)
		}
		return s
	}
	var sink atomic.Uint64
	for _, impl := range []string{"split", "waitgroup"} {
		b.Run(impl, func(b *testing.B) {
			for b.Loop() {
				if impl == "split" {
					Split(2, func(int) { sink.Add(uint64(work(2000))) })
				} else {
					var wg sync.WaitGroup
					wg.Go(func() { sink.Add(uint64(work(2000))) })
					sink.Add(uint64(work(2000)))
					wg.Wait()
				}
				sink.Add(uint64(work(100000)))
			}
		})
	}
}
