package main

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
)

// TestClassifierTrainsSavesAndResumes runs the program for 3 epochs with checkpoints, then resumes it to 5:
// it learns the clusters, saves every epoch, and the resumed run starts where the first stopped.
func TestClassifierTrainsSavesAndResumes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	var first strings.Builder
	require.NoError(t, run([]string{"-epochs", "3", "-checkpoints", dir}, &first))
	saved, err := accel.ListCheckpoints(dir)
	require.NoError(t, err)
	assert.Len(t, saved, 3, "a checkpoint per epoch")

	var resumed strings.Builder
	require.NoError(t, run([]string{"-epochs", "5", "-checkpoints", dir, "-resume"}, &resumed))
	assert.Contains(t, resumed.String(), "resumed at epoch 3")
	assert.NotContains(t, resumed.String(), "epoch 3:", "the resumed run does not train epoch 3 again")
	m := regexp.MustCompile(`epoch 5: accuracy ([0-9.]+)`).FindStringSubmatch(resumed.String())
	require.NotNil(t, m, resumed.String())
	accuracy, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	assert.Greater(t, accuracy, 0.9, "three well separated clusters")
}
