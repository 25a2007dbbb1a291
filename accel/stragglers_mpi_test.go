package accel_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// stragglerRun is what a rank of TestStragglerWarning reports.
type stragglerRun struct {
	Output  string // what the accelerator printed (the main process's)
	Steps   int64
	Timings accel.RankTimings
}

// TestStragglerWarning: 2 ranks train 60 optimizer steps, each sleeping after every step; with rank 1
// sleeping 40 ms more than rank 0 the main process warns exactly once that rank 1 is a straggler, and
// RankTimings shows rank 1's longer steps and rank 0's longer waits; with even sleeps nothing is said.
func TestStragglerWarning(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sleep [2]time.Duration
		warns bool
	}{
		{"one rank slowed", [2]time.Duration{10 * time.Millisecond, 50 * time.Millisecond}, true},
		{"even ranks", [2]time.Duration{20 * time.Millisecond, 20 * time.Millisecond}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if mpitest.IsRank() {
				if !strings.HasSuffix(t.Name(), strings.ReplaceAll(tc.name, " ", "_")) {
					return
				}
				mpitest.Do(t, func() (any, error) {
					var out bytes.Buffer
					acc, err := accel.New(accel.WithBackend("go"), accel.WithOutput(&out))
					if err != nil {
						return nil, err
					}
					const steps, batch = 60, 4
					inputs, labels := testmodel.Data(steps*batch*acc.WorldSize(), 3)
					sleep := tc.sleep[acc.Rank()]
					res, err := testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: batch, Epochs: 1,
						AfterStep: func(int64) error {
							time.Sleep(sleep)
							return nil
						}}.Train(acc)
					if err != nil {
						_ = acc.CloseWithError(err)
						return nil, err
					}
					timings, err := acc.RankTimings()
					if err != nil {
						_ = acc.CloseWithError(err)
						return nil, err
					}
					return stragglerRun{Output: out.String(), Steps: res.Steps, Timings: timings}, acc.Close()
				})
				return
			}
			results := mpitest.Run(t, 2, t.Name())
			var runs [2]stragglerRun
			for r := range 2 {
				require.NoError(t, results[r].Decode(&runs[r]))
				assert.Equal(t, int64(60), runs[r].Steps)
			}
			main := runs[0].Output
			assert.Empty(t, runs[1].Output, "only the main process prints")
			if tc.warns {
				assert.Equal(t, 1, strings.Count(main, "is a straggler"), "warned once:\n%s", main)
				assert.Regexp(t, `goaccel: rank 1 is a straggler: over optimizer steps 21-40 its median step took \S+, \d+% more `+
					`than the median of the ranks`, main)
			} else {
				assert.NotContains(t, main, "straggler")
			}
			timings := runs[0].Timings
			require.Len(t, timings, 2)
			assert.Equal(t, runs[0].Timings, runs[1].Timings, "every rank gets every rank's timings")
			for r, tm := range timings {
				assert.Equal(t, r, tm.Rank)
				assert.Equal(t, int64(58), tm.Steps, "all but the first step, and the last (no collective after it)")
				assert.GreaterOrEqual(t, tm.StepMedian, tc.sleep[r], "rank %d: the sleep is part of its step", r)
				assert.GreaterOrEqual(t, tm.StepP95, tm.StepMedian)
			}
			if tc.warns {
				assert.Greater(t, timings[1].StepMedian, timings[0].StepMedian+30*time.Millisecond)
				assert.Greater(t, timings[0].SyncWait, timings[1].SyncWait+time.Second, "rank 0 waits for rank 1")
			}
			t.Logf("rank 0 printed:\n%s\nRankTimings:\n%s", main, timings)
		})
	}
}
