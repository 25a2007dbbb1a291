package accel_test

import (
	"fmt"
	"time"

	"github.com/goaccel/goaccel/accel"
)

// RankTimings is collective: every rank calls it at the end of the run, and the main process prints it.
// Here, the table for a job whose rank 1 takes five times as long per step as rank 0, which waits for it.
func ExampleRankTimings() {
	timings := accel.RankTimings{
		{Rank: 0, Steps: 58, StepMedian: 10480 * time.Microsecond, StepP95: 11300 * time.Microsecond, SyncWait: 2450 * time.Millisecond},
		{Rank: 1, Steps: 58, StepMedian: 50480 * time.Microsecond, StepP95: 53600 * time.Microsecond, SyncWait: 61 * time.Millisecond},
	}
	fmt.Print(timings)
	// Output:
	// rank    steps  step median     step p95    sync wait
	// 0          58       10.5ms       11.3ms        2.45s
	// 1          58       50.5ms       53.6ms         61ms  (slowest)
}
