package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

// TestTrains: the LSTM learns to continue sines, from a first epoch's mean squared error above 0.02 to a
// last epoch's below 0.005 (predicting 0 scores about 0.5, repeating the last sample about 0.1), and the
// summary counts the job.
func TestTrains(t *testing.T) {
	code, stdout, stderr := runMain(t, "-epochs", "8", "-examples", "256", "-length", "8", "-hidden", "16",
		"-batch", "16", "-lr", "0.02", "-seed", "7")
	require.Equal(t, exitOK, code, stderr)
	s := parseSummary(t, stdout)
	t.Logf("mean squared error %.5f → %.6f, %.0f examples/s", float64(s.FirstLoss), float64(s.FinalLoss), s.ExamplesPerSecond)
	assert.Greater(t, float64(s.FirstLoss), 0.02, "the task is too easy to show learning")
	assert.Less(t, float64(s.FinalLoss), 0.005)
	assert.Equal(t, 256, s.TrainExamples)
	assert.Equal(t, 8, s.Epochs)
	assert.EqualValues(t, 8*256/16, s.OptimizerSteps)
	assert.Equal(t, 4*16*1+4*16*16+8*16+16+1, s.Parameters, "LSTM kernels and both sets of biases, the dense head")
	assert.Equal(t, 1, s.WorldSize)
	assert.Equal(t, "lstm", s.Model)
	assert.Positive(t, s.ExamplesPerSecond)
	assert.Positive(t, s.TrainSeconds)
	assert.Contains(t, stdout, "epoch 8/8: mean train loss ")

	// -quiet leaves out the epochs' lines, and the same seed trains the same way.
	code, quiet, stderr := runMain(t, "-epochs", "8", "-examples", "256", "-length", "8", "-hidden", "16",
		"-batch", "16", "-lr", "0.02", "-seed", "7", "-quiet")
	require.Equal(t, exitOK, code, stderr)
	assert.NotContains(t, quiet, "epoch 1/8")
	assert.Equal(t, s.FinalLoss, parseSummary(t, quiet).FinalLoss, "a run repeats from its seed")
}

// TestDropsTheLastBatch: a partial last batch is not trained, so every step has the compiled shape.
func TestDropsTheLastBatch(t *testing.T) {
	code, stdout, stderr := runMain(t, "-epochs", "1", "-examples", "40", "-length", "4", "-hidden", "4",
		"-batch", "16", "-quiet")
	require.Equal(t, exitOK, code, stderr)
	s := parseSummary(t, stdout)
	assert.Equal(t, 32, s.TrainExamples)
	assert.EqualValues(t, 2, s.OptimizerSteps)

	code, _, stderr = runMain(t, "-examples", "8", "-batch", "16")
	assert.Equal(t, exitError, code)
	assert.Contains(t, stderr, "an epoch would have no batch")
}

func TestBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-epochs", "0"}, "-epochs must be at least 1"},
		{[]string{"-batch", "0"}, "-batch must be at least 1"},
		{[]string{"-examples", "0"}, "-examples must be at least 1"},
		{[]string{"-length", "0"}, "-length must be at least 1"},
		{[]string{"-hidden", "0"}, "-hidden must be at least 1"},
		{[]string{"-lr", "-1"}, "-lr must be a positive number"},
		{[]string{"extra"}, `unexpected arguments ["extra"]`},
		{[]string{"-no-such-flag"}, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, _, stderr := runMain(t, tt.args...)
			assert.Equal(t, exitUsage, code)
			assert.Contains(t, stderr, tt.want)
		})
	}
	code, _, _ := runMain(t, "-h")
	assert.Equal(t, exitOK, code)
}

// TestSineData: SplitMix64 is the published generator (the first outputs from seed 0 are its reference
// values), and the sequences continue sines of frequencies in [0.3, 0.8).
func TestSineData(t *testing.T) {
	rng := splitMix64{}
	assert.Equal(t, []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f},
		[]uint64{rng.next(), rng.next(), rng.next()})

	x, y := sineData(50, 6, 3)
	assert.Equal(t, []int{50, 6, 1}, x.Shape().Dimensions)
	assert.Equal(t, []int{50, 1}, y.Shape().Dimensions)
	xs, ys := tensors.MustCopyFlatData[float32](x), tensors.MustCopyFlatData[float32](y)
	for i := range 50 {
		seq := xs[i*6 : (i+1)*6]
		if math.Abs(float64(seq[1])) < 0.2 {
			continue // the ratio below is ill-conditioned
		}
		// A sine sampled at unit steps satisfies s(t+1) = c·s(t) − s(t−1) with c = 2cos(w), in
		// [2cos(0.8), 2cos(0.3)].
		c := float64(seq[2]+seq[0]) / float64(seq[1])
		assert.GreaterOrEqual(t, c, 2*math.Cos(0.8)-1e-4, "sequence %d", i)
		assert.LessOrEqual(t, c, 2*math.Cos(0.3)+1e-4, "sequence %d", i)
		assert.InDelta(t, c*float64(seq[5])-float64(seq[4]), float64(ys[i]), 1e-3, "sequence %d continues", i)
	}
}

// TestSineDataMatchesTheTwin: internal/bench/pytorch/lstm_sine.py draws the same sequences from the same
// seed, so that the benchmark's two sides train on the same data.
func TestSineDataMatchesTheTwin(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3: the twin's data is not compared")
	}
	dir, err := filepath.Abs("../../internal/bench/pytorch")
	require.NoError(t, err)
	const n, length, seed = 20, 5, 1234567
	out, err := exec.Command(python, "-c", fmt.Sprintf(`import json, sys
sys.path.insert(0, %q)
import lstm_sine
print(json.dumps(lstm_sine.sine_data(%d, %d, %d)))`, dir, n, length, seed)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	var twin [2]json.RawMessage
	require.NoError(t, json.Unmarshal(out, &twin))
	var xs [][]float64
	var ys []float64
	require.NoError(t, json.Unmarshal(twin[0], &xs))
	require.NoError(t, json.Unmarshal(twin[1], &ys))
	x, y := sineData(n, length, seed)
	gx, gy := tensors.MustCopyFlatData[float32](x), tensors.MustCopyFlatData[float32](y)
	require.Len(t, xs, n)
	for i := range n {
		for j := range length {
			assert.Equal(t, gx[i*length+j], float32(xs[i][j]), "sequence %d, sample %d", i, j)
		}
		assert.Equal(t, gy[i], float32(ys[i]), "sequence %d's target", i)
	}
}
