package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/datasets/fashionmnist"
	"github.com/goaccel/goaccel/internal/testing/idxtest"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

func TestMain(m *testing.M) { mpitest.Main(m) }

// writeFakeDataset writes a tiny dataset in Fashion-MNIST's file format: the image of an example of class
// c is bright in the c-th band of rows, so there is something to learn.
func writeFakeDataset(t *testing.T, nTrain, nTest int) string {
	t.Helper()
	dir := t.TempDir()
	for _, split := range []struct {
		split fashionmnist.Split
		n     int
	}{{fashionmnist.Train, nTrain}, {fashionmnist.Test, nTest}} {
		images := make([]uint8, split.n*fashionmnist.ImageSize)
		labels := make([]uint8, split.n)
		for i := range split.n {
			c := (i*7 + int(split.split)) % fashionmnist.NumClasses
			labels[i] = uint8(c)
			for j := range fashionmnist.ImageSize {
				v := uint8((i*31 + j*17) % 64) // noise
				if row := j / fashionmnist.Width; row/3 == c {
					v += 180
				}
				images[i*fashionmnist.ImageSize+j] = v
			}
		}
		idxtest.WriteArray(t, dir, split.split.ImagesFile(), []int{split.n, fashionmnist.Height, fashionmnist.Width}, images, true)
		idxtest.WriteArray(t, dir, split.split.LabelsFile(), []int{split.n}, labels, true)
	}
	return dir
}

// requireDataset skips a test that needs the real Fashion-MNIST when it is not installed, or fails it when
// CI=true.
func requireDataset(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(fashionmnist.DefaultDir); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Fashion-MNIST is required in CI (apt-get install %s): %v", fashionmnist.DebianPackage, err)
		}
		t.Skipf("Fashion-MNIST not installed (apt-get install %s): %v", fashionmnist.DebianPackage, err)
	}
}

// runMain runs the program in-process and returns its exit code and output.
func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// parseSummary decodes the last line of stdout, which must be the summary.
func parseSummary(t *testing.T, stdout string) summary {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	var s summary
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &s), "the last line is no summary:\n%s", stdout)
	return s
}

// parameters is the model's size by hand: what the PyTorch twin's parameters() counts for the same shape.
func parameters(width, blocks int) int {
	convBN := func(in, out, size int) int { return size*size*in*out + 2*out } // no bias; BN scale and offset
	basic := func(in, out int) int { return convBN(in, out, 3) + convBN(out, out, 3) }
	n := convBN(1, width, 3)
	n += blocks * basic(width, width)
	n += basic(width, 2*width) + convBN(width, 2*width, 1) // the strided block and its projection
	n += (blocks - 1) * basic(2*width, 2*width)
	return n + 2*width*fashionmnist.NumClasses + fashionmnist.NumClasses
}

// TestShapesAndSummary trains on a tiny synthetic dataset: the model has the architecture's parameters for
// several widths and depths, and the summary counts the job.
func TestShapesAndSummary(t *testing.T) {
	dir := writeFakeDataset(t, 96, 40)
	assert.Equal(t, 19706, parameters(16, 1), "the default model")
	for _, tc := range []struct{ width, blocks int }{{4, 1}, {6, 2}} {
		t.Run(fmt.Sprintf("width %d, blocks %d", tc.width, tc.blocks), func(t *testing.T) {
			code, stdout, stderr := runMain(t, "-data", dir, "-epochs", "2", "-batch", "16", "-k", "2", "-width",
				strconv.Itoa(tc.width), "-blocks", strconv.Itoa(tc.blocks), "-seed", "3")
			require.Equal(t, exitOK, code, "stderr: %s", stderr)
			s := parseSummary(t, stdout)
			assert.Equal(t, parameters(tc.width, tc.blocks), s.Parameters)
			assert.Equal(t, "resnet", s.Model)
			assert.Equal(t, 1, s.WorldSize)
			assert.Equal(t, 96, s.TrainExamples)
			assert.EqualValues(t, 12, s.MicroBatches, "2 epochs of 6 batches")
			assert.EqualValues(t, 6, s.OptimizerSteps, "k = 2")
			assert.Equal(t, 32, s.GlobalBatch)
			assert.Positive(t, s.ExamplesPerSecond)
			assert.False(t, math.IsNaN(float64(s.FinalLoss)))
			assert.InDelta(t, 0.5, float64(s.TestAccuracy), 0.5)
			assert.Contains(t, stdout, "epoch 2/2: mean train loss")
		})
	}
}

// TestLearnsFashionMNIST: a short run on a subset of the real dataset is far above chance (0.1) on the
// whole test set. One epoch of 4,096 examples reaches about 0.65; the default three epochs of everything
// reach about 0.88 (0.8815 at seed 42, 44 s per epoch on one process of 2 cores).
func TestLearnsFashionMNIST(t *testing.T) {
	requireDataset(t)
	code, stdout, stderr := runMain(t, "-limit", "4096", "-epochs", "1", "-quiet")
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	s := parseSummary(t, stdout)
	assert.Greater(t, float64(s.TestAccuracy), 0.5, "test accuracy after one epoch of 4096 examples")
	assert.Less(t, float64(s.FinalLoss), 2.0, "the mean training loss falls below ln 10 = 2.30")
	assert.EqualValues(t, 64, s.OptimizerSteps)
	assert.NotContains(t, stdout, "epoch 1/1", "-quiet")
	t.Logf("test accuracy %.4f, final loss %.4f, %.0f examples/s", s.TestAccuracy, s.FinalLoss, s.ExamplesPerSecond)
}

// TestCheckpointAndResume: a run saves after every epoch; a second run with -resume and more epochs starts
// where the first stopped and trains only the epochs left.
func TestCheckpointAndResume(t *testing.T) {
	data := writeFakeDataset(t, 64, 20)
	dir := filepath.Join(t.TempDir(), "ckpt")
	common := []string{"-data", data, "-batch", "16", "-width", "4", "-seed", "9", "-checkpoints", dir}
	code, stdout, stderr := runMain(t, append(common, "-epochs", "1")...)
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	first := parseSummary(t, stdout)
	saved, err := accel.ListCheckpoints(dir)
	require.NoError(t, err)
	require.Len(t, saved, 1)

	code, stdout, stderr = runMain(t, append(common, "-epochs", "3", "-resume")...)
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	resumed := parseSummary(t, stdout)
	assert.Contains(t, stdout, "resumed from "+dir+" at epoch 2, 4 optimizer steps done")
	assert.NotContains(t, stdout, "epoch 1/3", "the first epoch is not trained again")
	assert.EqualValues(t, 4, first.OptimizerSteps)
	assert.EqualValues(t, 12, resumed.OptimizerSteps, "the resumed run counts from the checkpoint's steps")
	saved, err = accel.ListCheckpoints(dir)
	require.NoError(t, err)
	assert.Len(t, saved, 3, "one checkpoint per epoch")
}

func TestBadFlags(t *testing.T) {
	for args, want := range map[string]string{
		"-batch 1":         "-batch must be at least 2",
		"-k 0":             "-k must be at least 1",
		"-lr 0":            "-lr must be a positive number",
		"-width 0":         "-width must be at least 1",
		"-blocks 0":        "-blocks must be at least 1",
		"-dropout 1":       "-dropout must be in [0, 1)",
		"-epochs 0":        "-epochs must be at least 1",
		"-resume":          "-resume needs -checkpoints",
		"-limit -1":        "-limit must be 0 (all) or positive",
		"extra":            `unexpected arguments ["extra"]`,
		"-no-such-flag":    "flag provided but not defined",
		"-data /nonexist":  "", // not a usage error: the run fails
		"-dropout 0.5 x y": `unexpected arguments ["x" "y"]`,
	} {
		t.Run(args, func(t *testing.T) {
			code, _, stderr := runMain(t, strings.Fields(args)...)
			if want == "" {
				assert.Equal(t, exitError, code)
				assert.Contains(t, stderr, "/nonexist")
				return
			}
			assert.Equal(t, exitUsage, code)
			assert.Contains(t, stderr, want)
		})
	}
}
