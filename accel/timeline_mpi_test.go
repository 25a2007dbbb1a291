package accel_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/traceevent"
)

// timelineDirEnv tells TestTimelineUnderMPI's ranks where to write, where the test reads.
const timelineDirEnv = "GOACCEL_TEST_TIMELINE_DIR"

// TestTimelineUnderMPI: 2 processes under mpirun train with the timeline on, save and load a checkpoint;
// the main process's merged file has both ranks' rows, a forward and backward pass per micro-batch, one
// all-reduce per bucket per sync on each bucket's track with its wait, the optimizer steps, the save and
// the load; and with the clocks aligned, each all-reduce on rank 1 overlaps the same one on rank 0.
func TestTimelineUnderMPI(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			dir := os.Getenv(timelineDirEnv)
			acc, err := accel.New(append([]accel.Option{accel.WithTimeline(filepath.Join(dir, "timeline.json"))},
				timelineOptions...)...)
			if err != nil {
				return nil, err
			}
			run, err := timelineTrain(acc, filepath.Join(dir, "ckpt"), 5)
			if err != nil {
				_ = acc.CloseWithError(err)
				return nil, err
			}
			return run, acc.Close()
		})
		return
	}
	mpitest.RequireMPIRun(t)
	dir := t.TempDir()
	results := mpitest.Run(t, 2, "TestTimelineUnderMPI", mpitest.WithTimeout(3*time.Minute),
		mpitest.WithEnv(timelineDirEnv+"="+dir))
	runs := make([]timelineRun, 2)
	for r, res := range results {
		require.NoError(t, res.Decode(&runs[r]))
	}
	require.Equal(t, runs[0].Weights, runs[1].Weights, "replicas agree")
	f, err := traceevent.ReadFile(filepath.Join(dir, "timeline.json"))
	require.NoError(t, err)
	checkTimeline(t, f, runs)
	t.Logf("clocks: %v", f.OtherData)
}
