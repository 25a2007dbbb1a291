package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/datasets/fashionmnist"
	"github.com/goaccel/goaccel/internal/testing/idxtest"
)

// writeFakeDataset writes a tiny dataset in Fashion-MNIST's file format: the image of an example of
// class c is bright in the c-th band of rows, so the MLP has something to learn.
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

// runMain runs the program in-process and returns its exit code and output.
func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

var summaryKeys = []string{"goaccel_version", "compute_threads",
	"rank", "world_size", "epochs", "batch_size", "accumulation_steps", "global_batch", "optimizer_steps", "syncs",
	"micro_batches", "collective_calls", "collective_bytes", "comm_wait_seconds", "compute_seconds",
	"micro_batch_compute_seconds", "train_examples", "test_accuracy", "best_test_accuracy", "restart_count", "final_loss", "model", "train_seconds",
	"examples_per_second", "seconds", "sharding", "optimizer_state_bytes",
	"comm_hook", "compression_ratio", "mode", "parameter_averages", "overlapped_buckets",
	"overlap_done_in_step", "overlap_in_step_seconds",
}

// parseSummary checks that the last stdout line is a JSON object with exactly the summary's keys.
func parseSummary(t *testing.T, stdout string) summary {
	t.Helper()
	line := lastLine(stdout)
	var keys map[string]any
	require.NoError(t, json.Unmarshal([]byte(line), &keys), "last line of stdout is not JSON: %q", line)
	var got []string
	for k := range keys {
		got = append(got, k)
	}
	require.ElementsMatch(t, summaryKeys, got)
	var s summary
	require.NoError(t, json.Unmarshal([]byte(line), &s))
	return s
}

// TestLocalSGDFlags: -local-sgd and -diloco train without gradient syncs and average every H optimizer
// steps (12 micro-batches, K=2: 6 steps, H=2: 3 averages); the summary says the mode. Both at once, or a
// negative period, are usage errors.
func TestLocalSGDFlags(t *testing.T) {
	dir := writeFakeDataset(t, 100, 30)
	for _, tc := range []struct {
		flag, mode string
	}{{"-local-sgd", "local SGD (H=2)"}, {"-diloco", "DiLoCo (H=2, outer lr 0.7, momentum 0.9)"}} {
		t.Run(tc.flag, func(t *testing.T) {
			code, stdout, stderr := runMain(t, "-data", dir, "-limit", "96", "-epochs", "1", "-batch", "8", "-k", "2",
				"-hidden", "16", "-seed", "7", tc.flag, "2")
			require.Equal(t, exitOK, code, "stderr: %s", stderr)
			s := parseSummary(t, stdout)
			assert.Equal(t, tc.mode, s.Mode)
			assert.EqualValues(t, 6, s.OptimizerSteps)
			assert.EqualValues(t, 3, s.ParameterAverages)
			assert.Zero(t, s.Syncs, "no gradient sync")
		})
	}
	for _, args := range [][]string{{"-local-sgd", "2", "-diloco", "2"}, {"-diloco", "-1"}} {
		code, _, stderr := runMain(t, append([]string{"-data", dir}, args...)...)
		assert.Equal(t, exitUsage, code, "%v", args)
		assert.Contains(t, stderr, "-local-sgd and -diloco")
	}
}

func TestSummaryMatchesAccumulation(t *testing.T) {
	dir := writeFakeDataset(t, 100, 30)
	for _, tc := range []struct {
		name                   string
		limit, batch, k        int
		wantBatches, wantSteps int
	}{
		{name: "k divides the batches", limit: 96, batch: 8, k: 4, wantBatches: 12, wantSteps: 3},
		{name: "last step is short", limit: 80, batch: 8, k: 3, wantBatches: 10, wantSteps: 4},
		{name: "last batch is short", limit: 75, batch: 8, k: 4, wantBatches: 10, wantSteps: 3},
		{name: "no accumulation", limit: 40, batch: 8, k: 1, wantBatches: 5, wantSteps: 5},
		{name: "k beyond the epoch", limit: 24, batch: 8, k: 8, wantBatches: 3, wantSteps: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runMain(t, "-data", dir, "-limit", strconv.Itoa(tc.limit), "-epochs", "1",
				"-batch", strconv.Itoa(tc.batch), "-k", strconv.Itoa(tc.k), "-hidden", "16", "-seed", "7")
			require.Equal(t, exitOK, code, "stderr: %s", stderr)
			s := parseSummary(t, stdout)
			assert.Equal(t, 0, s.Rank)
			assert.Equal(t, 1, s.WorldSize)
			assert.Equal(t, 1, s.Epochs)
			assert.Equal(t, tc.batch, s.BatchSize)
			assert.Equal(t, tc.k, s.AccumulationSteps)
			assert.Equal(t, tc.k*tc.batch, s.GlobalBatch)
			assert.Equal(t, int64(tc.wantBatches), s.MicroBatches)
			assert.Equal(t, int64((tc.wantBatches+tc.k-1)/tc.k), s.OptimizerSteps, "ceil(batches/k)")
			assert.Equal(t, int64(tc.wantSteps), s.OptimizerSteps)
			assert.Equal(t, s.OptimizerSteps, s.Syncs, "one sync per optimizer step")
			assert.Zero(t, s.CollectiveCalls, "a single process does not communicate")
			assert.Zero(t, s.CollectiveBytes)
			assert.Equal(t, tc.limit, s.TrainExamples)
			assert.True(t, s.TestAccuracy >= 0 && s.TestAccuracy <= 1, "accuracy %g", s.TestAccuracy)
			loss := float64(s.FinalLoss)
			assert.True(t, loss > 0 && !math.IsInf(loss, 0) && !math.IsNaN(loss), "final loss %g", loss)
			assert.Positive(t, s.ComputeSeconds)
			assert.GreaterOrEqual(t, s.Seconds, s.ComputeSeconds)
			// The micro-batch steps are part of the compute time; the optimizer's updates are the rest.
			assert.Positive(t, s.MicroBatchComputeSeconds)
			assert.Less(t, s.MicroBatchComputeSeconds, s.ComputeSeconds)
			assert.Contains(t, stdout, "test accuracy:")
		})
	}
}

func TestProgressAndPlot(t *testing.T) {
	dir := writeFakeDataset(t, 64, 20)
	plot := filepath.Join(t.TempDir(), "loss.png")
	code, stdout, stderr := runMain(t, "-data", dir, "-epochs", "2", "-batch", "4", "-k", "2", "-hidden", "8",
		"-plot", plot)
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	s := parseSummary(t, stdout)
	assert.Equal(t, int64(16), s.OptimizerSteps, "2 epochs × ceil(16 batches / 2)")

	// Output that is not a terminal gets plain progress lines instead of a bar: no carriage returns.
	assert.Contains(t, stdout, "epoch 1/2  25% 4/16 batches")
	assert.Contains(t, stdout, "epoch 2/2: mean train loss")
	assert.NotContains(t, stdout, "\r")

	f, err := os.Open(plot)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err, "the plot is not a PNG")
	assert.Positive(t, img.Bounds().Dx())
	// The plot is drawn from the log written beside it: one loss per optimizer step.
	logged, err := readLossLog(strings.TrimSuffix(plot, ".png") + ".jsonl")
	require.NoError(t, err)
	assert.Len(t, logged.Y, 16)
	assert.Equal(t, 16.0, logged.X[15])

	// -quiet drops the progress lines, not the results.
	code, stdout, stderr = runMain(t, "-data", dir, "-epochs", "1", "-batch", "4", "-k", "2", "-hidden", "8", "-quiet")
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	assert.NotContains(t, stdout, "batches/s")
	assert.Contains(t, stdout, "test accuracy:")
	parseSummary(t, stdout)
}

func TestMissingDataDir(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-dir")
	code, stdout, stderr := runMain(t, "-data", missing, "-epochs", "1")
	assert.NotEqual(t, exitOK, code)
	assert.Contains(t, stderr, fashionmnist.DebianPackage, "the error says which package installs the data")
	assert.Contains(t, stderr, missing)
	assert.NotContains(t, stdout, "{", "no summary after a failure")
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"-k", "0"}, "-k"},
		{[]string{"-batch", "0"}, "-batch"},
		{[]string{"-epochs", "-1"}, "-epochs"},
		{[]string{"-model", "rnn"}, "-model"},
		{[]string{"-lr", "0"}, "-lr"},
		{[]string{"-lr", "NaN"}, "-lr"},
		{[]string{"-hidden", "-3"}, "-hidden"},
		{[]string{"-limit", "-1"}, "-limit"},
		{[]string{"-data", ""}, "-data"},
		{[]string{"-k", "four"}, "-k"},
		{[]string{"-no-such-flag"}, "no-such-flag"},
		{[]string{"extra"}, "extra"},
		{[]string{"-plot", os.TempDir()}, "-plot " + os.TempDir() + " is a directory: name a file"},
		{[]string{"-plot", "/no/such/dir/loss.png"}, "directory /no/such/dir does not exist"},
		{[]string{"-log", os.TempDir()}, "-log " + os.TempDir() + " is a directory"},
		{[]string{"-checkpoint-every", "-1", "-checkpoints", os.TempDir()}, "-checkpoint-every must be 0"},
		{[]string{"-checkpoint-every", "2"}, "-checkpoint-every needs -checkpoints"},
		{[]string{"-stop-after-batches", "-1"}, "-stop-after-batches must be 0"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runMain(t, tc.args...)
			assert.Equal(t, exitUsage, code)
			assert.Contains(t, stderr, tc.want)
			assert.Empty(t, stdout)
		})
	}
	code, _, stderr := runMain(t, "-h")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stderr, "usage: grad_accum")
}

func TestJSONFloatKeepsTheLineValid(t *testing.T) {
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		b, err := json.Marshal(summary{FinalLoss: jsonFloat(v)})
		require.NoError(t, err)
		assert.Contains(t, string(b), `"final_loss":null`)
	}
}

// TestRealDataset trains briefly on the real Fashion-MNIST: well above the 10% of chance after one short
// epoch shows that the data, the model and the accumulation path fit together.
func TestRealDataset(t *testing.T) {
	if _, err := os.Stat(fashionmnist.DefaultDir); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Fashion-MNIST is required in CI (apt-get install %s): %v", fashionmnist.DebianPackage, err)
		}
		t.Skipf("Fashion-MNIST not installed (apt-get install %s): %v", fashionmnist.DebianPackage, err)
	}
	code, stdout, stderr := runMain(t, "-limit", "2000", "-epochs", "1", "-quiet")
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	s := parseSummary(t, stdout)
	assert.Equal(t, 2000, s.TrainExamples)
	assert.Greater(t, float64(s.TestAccuracy), 0.5)
}

// TestDivergedRunFails: a run whose loss ends NaN or infinite still prints its summary (final_loss null)
// but exits non-zero with a message saying it diverged, and reports no test accuracy (null in the
// summary), with or without -eval-each-epoch: the destroyed model's score is no result.
func TestDivergedRunFails(t *testing.T) {
	dir := writeFakeDataset(t, 64, 16)
	for _, extra := range [][]string{nil, {"-eval-each-epoch"}} {
		args := append([]string{"-data", dir, "-epochs", "1", "-batch", "8", "-k", "1", "-hidden", "8", "-lr", "1e38",
			"-quiet"}, extra...)
		code, stdout, stderr := runMain(t, args...)
		assert.Equal(t, exitError, code, "%v\nstdout: %s\nstderr: %s", extra, stdout, stderr)
		assert.Contains(t, stderr, "training diverged")
		assert.Contains(t, lastLine(stdout), `"final_loss":null`)
		assert.Contains(t, lastLine(stdout), `"test_accuracy":null`, "%v", extra)
		assert.Contains(t, stdout, "test accuracy: not reported, training diverged\n")
		assert.NotRegexp(t, `(?m)^test accuracy: \d`, stdout, "%v", extra)
	}
}

// TestUnwritableLogStopsBeforeTraining: -log naming a file that cannot be created fails when the job
// starts, with the path, before the data is loaded, as -checkpoints does; a log that can be written is
// neither created nor changed by the check.
func TestUnwritableLogStopsBeforeTraining(t *testing.T) {
	if _, err := os.Stat("/proc/self"); err != nil {
		t.Skip("needs /proc, where no file can be created")
	}
	code, stdout, stderr := runMain(t, "-data", t.TempDir(), "-epochs", "1", "-log", "/proc/nope.csv")
	assert.Equal(t, exitError, code)
	assert.Contains(t, stderr, "-log: open /proc/nope.csv")
	assert.NotContains(t, stderr, fashionmnist.DebianPackage, "the data is not loaded first")
	assert.NotContains(t, stdout, "epoch 1/1")

	existing := filepath.Join(t.TempDir(), "log.jsonl")
	require.NoError(t, os.WriteFile(existing, []byte("{\"step\":1}\n"), 0o644))
	missing := filepath.Join(t.TempDir(), "new.jsonl")
	for _, path := range []string{existing, missing} {
		require.NoError(t, checkWritable(path))
	}
	data, err := os.ReadFile(existing)
	require.NoError(t, err)
	assert.Equal(t, "{\"step\":1}\n", string(data))
	assert.NoFileExists(t, missing)
}

// TestResumedWithNothingLeftKeepsTheLoss: a run resumed from a checkpoint saved after its last epoch, with
// as many epochs or fewer, trains nothing and reports the final loss the checkpoint kept (the last epoch
// trained, as the run that saved it reported it), not 0.
func TestResumedWithNothingLeftKeepsTheLoss(t *testing.T) {
	dir := writeFakeDataset(t, 32, 8)
	for _, epochs := range []string{"2", "1"} {
		t.Run("-epochs "+epochs, func(t *testing.T) {
			ckpt := filepath.Join(t.TempDir(), "ckpt")
			args := []string{"-data", dir, "-batch", "4", "-k", "2", "-hidden", "8", "-quiet", "-checkpoints", ckpt}
			code, stdout, stderr := runMain(t, append(args, "-epochs", "2")...)
			require.Equal(t, exitOK, code, "stderr: %s", stderr)
			first := parseSummary(t, stdout)
			code, stdout, stderr = runMain(t, append(args, "-epochs", epochs, "-resume")...)
			require.Equal(t, exitOK, code, "stderr: %s", stderr)
			resumed := parseSummary(t, stdout)
			assert.Zero(t, resumed.MicroBatches, "nothing was left to train")
			assert.Equal(t, first.FinalLoss, resumed.FinalLoss)
			assert.NotContains(t, lastLine(stdout), `"final_loss":0,`)
		})
	}
}

// TestModelDefaults: each model has its own default number of epochs; an explicit -epochs wins.
func TestModelDefaults(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		wantEpochs int
	}{
		{nil, 3},
		{[]string{"-model", "mlp"}, 3},
		{[]string{"-model", "cnn"}, 5},
		{[]string{"-model", "cnn", "-epochs", "2"}, 2},
	} {
		cfg, err := parseFlags(tc.args, io.Discard)
		require.NoError(t, err, "%v", tc.args)
		assert.Equal(t, tc.wantEpochs, cfg.epochs, "%v", tc.args)
	}
}

// TestCSVLog: -log with a .csv name writes a CSV table: a loss per optimizer step, then the test accuracy
// in a column of its own on the last step.
func TestCSVLog(t *testing.T) {
	dir := writeFakeDataset(t, 64, 20)
	path := filepath.Join(t.TempDir(), "log.csv")
	code, _, stderr := runMain(t, "-data", dir, "-epochs", "1", "-batch", "4", "-k", "2", "-hidden", "8", "-quiet",
		"-log", path)
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, lines, 1+8+1, "header, 8 steps, and the accuracy row")
	assert.Equal(t, "step,loss,test_accuracy", lines[0])
	assert.True(t, strings.HasPrefix(lines[9], "8,,"), lines[9])
	logged, err := readLossLog(path)
	require.NoError(t, err)
	assert.Len(t, logged.Y, 8)
}

// TestResumeFromCheckpoint: a run that stops and is resumed from its checkpoint ends with the log of a run
// that never stopped, record for record (each step's loss, bitwise, and each test accuracy once), and
// the same optimizer steps, accuracies and final loss: after an epoch's end (no SetEpoch before the save),
// inside an accumulation cycle (the running loss and the partial gradients travel in the checkpoint),
// and with a checkpoint every 2 optimizer steps and an evaluation after every epoch (the best accuracy
// travels too). The evaluation loader, prepared inside evaluate after a checkpoint was saved, does not
// stand in the way.
func TestResumeFromCheckpoint(t *testing.T) {
	dir := writeFakeDataset(t, 64, 20)
	common := []string{"-data", dir, "-batch", "4", "-k", "3", "-hidden", "8", "-quiet", "-epochs", "2"}
	run := func(t *testing.T, args ...string) (summary, string) {
		t.Helper()
		code, stdout, stderr := runMain(t, append(slices.Clone(common), args...)...)
		require.Equal(t, exitOK, code, "stderr: %s", stderr)
		return parseSummary(t, stdout), stdout
	}
	for _, tc := range []struct {
		name  string
		flags []string // for both runs
		first []string // for the run that stops
	}{
		{"after an epoch", nil, []string{"-epochs", "1"}},
		{"inside an accumulation cycle", nil, []string{"-stop-after-batches", "5"}},
		{"every 2 steps, evaluating each epoch", []string{"-checkpoint-every", "2", "-eval-each-epoch"},
			[]string{"-stop-after-batches", "20"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			straightLog, resumedLog := filepath.Join(out, "straight.jsonl"), filepath.Join(out, "resumed.jsonl")
			ckpt := filepath.Join(out, "ckpt")
			// The run that never stops saves the same checkpoints, into a directory of its own.
			straight, _ := run(t, append(slices.Clone(tc.flags), "-log", straightLog, "-checkpoints", filepath.Join(out, "straight"))...)
			run(t, append(append(slices.Clone(tc.flags), tc.first...), "-log", resumedLog, "-checkpoints", ckpt)...)
			resumed, stdout := run(t, append(slices.Clone(tc.flags), "-log", resumedLog, "-checkpoints", ckpt, "-resume")...)
			assert.Contains(t, stdout, "resumed from "+ckpt)
			assert.Equal(t, straight.OptimizerSteps, resumed.OptimizerSteps)
			assert.Equal(t, straight.TestAccuracy, resumed.TestAccuracy)
			assert.Equal(t, straight.BestTestAccuracy, resumed.BestTestAccuracy)
			assert.Equal(t, straight.FinalLoss, resumed.FinalLoss, "the last epoch's loss counts the batches before the save")
			want, err := os.ReadFile(straightLog)
			require.NoError(t, err)
			got, err := os.ReadFile(resumedLog)
			require.NoError(t, err)
			assert.Equal(t, string(want), string(got))
			epochs := 1
			if slices.Contains(tc.flags, "-eval-each-epoch") {
				epochs = 2
			}
			assert.Equal(t, epochs, strings.Count(string(got), "test_accuracy"))
		})
	}

	code, _, stderr := runMain(t, append(slices.Clone(common), "-resume")...)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "-resume needs -checkpoints")
}

// TestResumeWithoutCheckpointStartsFresh: -resume on a directory with no checkpoint yet (the first run of a
// job that a launcher may restart) starts from the beginning and says so in one line.
func TestResumeWithoutCheckpointStartsFresh(t *testing.T) {
	dir := writeFakeDataset(t, 32, 8)
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	code, stdout, stderr := runMain(t, "-data", dir, "-batch", "4", "-k", "2", "-hidden", "8", "-quiet", "-epochs", "1",
		"-checkpoints", ckpt, "-resume")
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	assert.Equal(t, 1, strings.Count(stdout, "no checkpoint in "+ckpt+" yet: starting from the beginning\n"))
	assert.NotContains(t, stdout, "resumed from")
	assert.Equal(t, int64(4), parseSummary(t, stdout).OptimizerSteps)
}

// TestUnusableCheckpointDirStopsBeforeTraining: -checkpoints naming a file fails when the job starts,
// with the path, before any epoch.
func TestUnusableCheckpointDirStopsBeforeTraining(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	code, stdout, stderr := runMain(t, "-limit", "256", "-epochs", "1", "-checkpoints", file)
	assert.Equal(t, exitError, code)
	assert.Contains(t, stderr, file+" cannot hold checkpoints")
	assert.NotContains(t, stdout, "epoch 1/1", "nothing trained")
}
