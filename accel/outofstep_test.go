package accel_test

// Ranks that go out of step — another debug mode, a resume or a checkpoint on one rank only — fail on every
// rank with what differed, under real mpirun.

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// TestMPIDebugModeOnOneRankIsRefused: debug mode on one rank only is refused by every rank's New with the
// ranks named, before any collective runs call-checked on one side only (which garbled the messages).
func TestMPIDebugModeOnOneRankIsRefused(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			topo, err := backends.DetectTopology()
			if err != nil {
				return nil, err
			}
			opts := []accel.Option{accel.WithBackend("go")}
			if topo.Rank == 1 {
				opts = append(opts, accel.WithDebug())
			}
			acc, err := accel.New(opts...)
			if err == nil {
				_ = acc.Close()
				return nil, errors.New("New accepted debug mode on one rank only")
			}
			return err.Error(), nil
		})
		return
	}
	for _, r := range mpitest.Run(t, 2, t.Name()) {
		var msg string
		require.NoError(t, r.Decode(&msg))
		assert.Contains(t, msg, "the ranks disagree on debug mode (GOACCEL_DEBUG or accel.WithDebug): rank 0 has false; rank 1 has true",
			"rank %d", r.Rank)
	}
}

// TestMPIResumeOnOneRankIsNamed: a rank that loads a checkpoint while the other starts training (-resume
// given to one rank only) fails, on every rank, with what each rank is doing, instead of a later check
// misreading the other rank's messages ("bucket plans differ").
func TestMPIResumeOnOneRankIsNamed(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			acc, err := accel.New(accel.WithBackend("go"), accel.WithGradientAccumulationSteps(2))
			if err != nil {
				return nil, err
			}
			r := prepareResumable(t, acc, 16, 2, 1)
			if acc.Rank() == 0 {
				err = acc.LoadState(os.Getenv(checkpointDirEnv))
			} else {
				_, err = r.train(acc, 1, 0)
			}
			if err == nil {
				return nil, errors.New("a rank went on alone")
			}
			_ = acc.Close()
			return err.Error(), nil
		})
		return
	}
	for _, r := range mpitest.Run(t, 2, t.Name(), mpitest.WithEnv(checkpointDirEnv+"="+t.TempDir())) {
		var msg string
		require.NoError(t, r.Decode(&msg))
		assert.Contains(t, msg, "the ranks disagree on what each rank is doing: rank 0 has loading a checkpoint "+
			"(LoadState); rank 1 has training (the first Backward)", "rank %d", r.Rank)
	}
}

// TestMPIExtraSaveStateIsNamed: one rank saving a checkpoint the other does not save puts the ranks out of
// step. Whichever way the collectives then fail (an engine error or the watchdog), every rank's error
// names collective numbers, and a rank that learns of the other's failure says they are out of step.
func TestMPIExtraSaveStateIsNamed(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			acc, err := accel.New(accel.WithBackend("go"), accel.WithCollectiveTimeout(3*time.Second))
			if err != nil {
				return nil, err
			}
			r := prepareResumable(t, acc, 16, 2, 1)
			_, runErr := r.train(acc, 1, 2)
			if runErr == nil && acc.Rank() == 0 {
				_, runErr = acc.SaveState(os.Getenv(checkpointDirEnv))
			}
			if runErr == nil {
				_, runErr = r.train(acc, 2, 0)
			}
			if runErr == nil {
				return nil, errors.New("training went on although the ranks were out of step")
			}
			if err := mpitest.Report(runErr.Error(), nil); err != nil {
				return nil, err
			}
			waitForReports(acc.WorldSize())
			_ = acc.CloseWithError(runErr)
			return runErr.Error(), nil
		})
		return
	}
	out := mpitest.Launch(t, 2, t.Name(), mpitest.WithEnv(checkpointDirEnv+"="+t.TempDir()), mpitest.WithTimeout(60*time.Second))
	require.False(t, out.TimedOut, "the job hung:\n%s", out)
	sawStep := false
	for r := range 2 {
		res, ok := out.Result(r)
		require.True(t, ok, "rank %d reported nothing:\n%s", r, out)
		var msg string
		require.NoError(t, res.Decode(&msg))
		t.Logf("rank %d: %s", r, msg)
		assert.Contains(t, msg, "collective #", "rank %d names where it was", r)
		sawStep = sawStep || strings.Contains(msg, "made collective calls the other did not") ||
			strings.Contains(msg, "did not complete within")
	}
	assert.True(t, sawStep, "no rank said the ranks were out of step")
}
