package main

import (
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// TestResumeOnAnotherNumberOfProcesses: the demo stopped inside its epoch and resumed on another number of
// processes with the same global batch (1 × k=2 × batch 8 ↔ 2 × k=2 × batch 4, under `accel launch`)
// reports the epoch loss of a run that never stopped: the same final loss, and, when the resumed run has
// one process, the same epoch line. The losses are means over examples: the resumed part's micro-batches
// hold half (or twice) as many examples as the first part's, which a mean over micro-batches would weigh
// alike (it reported 1.437 and 1.707 resumed against 1.558 uninterrupted).
func TestResumeOnAnotherNumberOfProcesses(t *testing.T) {
	mpitest.RequireMPIRun(t)
	accelBin, demoBin := buildLauncherAndDemo(t)
	data := writeFakeDataset(t, 256, 32)
	common := []string{"-data", data, "-epochs", "1", "-hidden", "8", "-quiet", "-seed", "3", "-k", "2"}
	one, two := []string{"-batch", "8"}, []string{"-batch", "4"}
	args := func(batch []string, more ...string) []string {
		return append(append(slices.Clone(common), batch...), more...)
	}
	inProcess := func(more []string) (summary, string) {
		t.Helper()
		code, stdout, stderr := runMain(t, more...)
		require.Equal(t, exitOK, code, "stderr: %s", stderr)
		return parseSummary(t, stdout), stdout
	}
	epochLine := regexp.MustCompile(`epoch 1/1: mean train loss [0-9.]+`)
	straight, straightOut := inProcess(args(one))
	require.Equal(t, 1, straight.WorldSize)
	require.Equal(t, int64(16), straight.OptimizerSteps, "256 examples in steps of 16")

	t.Run("1 to 2 processes", func(t *testing.T) {
		ckpt := filepath.Join(t.TempDir(), "ckpt")
		inProcess(args(one, "-checkpoints", ckpt, "-stop-after-batches", "10")) // 5 of the 16 steps
		resumed := launchTwo(t, accelBin, demoBin, nil, args(two, "-checkpoints", ckpt, "-resume")...)
		assert.Equal(t, 2, resumed.WorldSize)
		assert.Equal(t, straight.GlobalBatch, resumed.GlobalBatch)
		assert.Equal(t, straight.OptimizerSteps, resumed.OptimizerSteps)
		assert.InDelta(t, float64(straight.FinalLoss), float64(resumed.FinalLoss), 1e-5)
	})
	t.Run("2 processes to 1", func(t *testing.T) {
		ckpt := filepath.Join(t.TempDir(), "ckpt")
		launchTwo(t, accelBin, demoBin, nil, args(two, "-checkpoints", ckpt, "-stop-after-batches", "14")...) // 7 steps
		resumed, out := inProcess(args(one, "-checkpoints", ckpt, "-resume"))
		assert.Equal(t, straight.OptimizerSteps, resumed.OptimizerSteps)
		assert.InDelta(t, float64(straight.FinalLoss), float64(resumed.FinalLoss), 1e-5)
		assert.Equal(t, epochLine.FindString(straightOut), epochLine.FindString(out), "the epoch line")
		assert.NotContains(t, out, "global batch changed")
	})
}
