package accel_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/internal/mpitest"
	"github.com/goaccel/goaccel/internal/testmodel"
)

// TestSharedCheckpointDirIsRefused: a second job given a checkpoint directory another job holds is refused
// when it starts, naming the holder, whether the first job declared the directory (WithCheckpointDir) or
// took it with its first SaveState; once the first job closes, the directory is free.
func TestSharedCheckpointDirIsRefused(t *testing.T) {
	t.Run("declared", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ckpt")
		first, err := accel.New(accel.WithBackend("go"), accel.WithCheckpointDir(dir))
		require.NoError(t, err)
		_, err = accel.New(accel.WithBackend("go"), accel.WithCheckpointDir(dir))
		var held *checkpoint.HeldError
		require.ErrorAs(t, err, &held)
		assert.Contains(t, err.Error(), "pid "+strconv.Itoa(os.Getpid()))
		require.NoError(t, first.Close())
		again, err := accel.New(accel.WithBackend("go"), accel.WithCheckpointDir(dir))
		require.NoError(t, err, "a closed job gives its directory back")
		require.NoError(t, again.Close())
	})
	t.Run("taken by SaveState", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ckpt")
		inputs, labels := testmodel.Data(8, 5)
		run := testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: 4}
		first := newSingle(t)
		_, err := run.Train(first)
		require.NoError(t, err)
		_, err = first.SaveState(dir)
		require.NoError(t, err)
		second := newSingle(t)
		_, err = run.Train(second)
		require.NoError(t, err)
		_, err = second.SaveState(dir)
		require.ErrorContains(t, err, "is in use by another job")
		checkpoints, err := checkpoint.List(dir)
		require.NoError(t, err)
		assert.Len(t, checkpoints, 1, "the refused job wrote nothing")
		_, err = first.SaveState(dir)
		require.NoError(t, err, "the holder keeps saving")
	})
}

// TestUnusableCheckpointDirFailsAtStart: a checkpoint directory that names a file is refused by New, not
// after the first epoch.
func TestUnusableCheckpointDirFailsAtStart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err := accel.New(accel.WithBackend("go"), accel.WithCheckpointDir(file))
	require.ErrorContains(t, err, file+" cannot hold checkpoints")
}

// TestMPIUnusableCheckpointDirFailsEveryRank: under mpirun, every rank's New returns the main process's
// refusal of the checkpoint directory, and none hangs.
func TestMPIUnusableCheckpointDirFailsEveryRank(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			acc, err := accel.New(accel.WithBackend("go"), accel.WithCheckpointDir(os.Getenv(checkpointDirEnv)))
			if err == nil {
				_ = acc.Close()
				return nil, errors.New("New accepted a checkpoint directory that is a file")
			}
			return err.Error(), nil
		})
		return
	}
	file := filepath.Join(t.TempDir(), "not-a-dir")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for _, r := range mpitest.Run(t, 2, t.Name(), mpitest.WithEnv(checkpointDirEnv+"="+file)) {
		var msg string
		require.NoError(t, r.Decode(&msg))
		assert.Contains(t, msg, file+" cannot hold checkpoints", "rank %d", r.Rank)
	}
}

// checkpointDirEnv passes the directory to the ranks of TestMPIUnusableCheckpointDirFailsEveryRank.
const checkpointDirEnv = "GOACCEL_TEST_CHECKPOINT_DIR"

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
