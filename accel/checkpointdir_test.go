package accel_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
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
