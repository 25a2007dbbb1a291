package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/datasets/fashionmnist"
	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// TestLaunchTwoProcessesMatchesOne: the unchanged demo under `accel launch -n 2` reaches the same test
// accuracy (±0.01) as one process on the same data, epochs and global batch (2 × 32 = 64 examples per
// micro-batch), with the same number of optimizer steps — and its gradients really crossed processes.
func TestLaunchTwoProcessesMatchesOne(t *testing.T) {
	accelBin, demoBin := buildLaunchable(t)
	common := []string{"-limit", "12000", "-epochs", "1", "-k", "2", "-quiet", "-seed", "5"}
	code, stdout, stderr := runMain(t, append([]string{"-batch", "64"}, common...)...)
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	single := parseSummary(t, stdout)
	double := launchTwo(t, accelBin, demoBin, nil, append([]string{"-batch", "32"}, common...)...)

	assert.Equal(t, 2, double.WorldSize)
	assert.Equal(t, single.GlobalBatch, double.GlobalBatch)
	assert.Equal(t, single.OptimizerSteps, double.OptimizerSteps)
	assert.Positive(t, double.CollectiveCalls, "two processes must exchange gradients")
	assert.InDelta(t, float64(single.TestAccuracy), float64(double.TestAccuracy), 0.01,
		"1 process: %.4f, 2 processes: %.4f", single.TestAccuracy, double.TestAccuracy)
	t.Logf("test accuracy: 1 process %.4f, 2 processes %.4f", single.TestAccuracy, double.TestAccuracy)
}

// buildLaunchable builds `accel` and the demo (with the mpi engine) for jobs started through `accel launch`
// on the real dataset, and returns their paths. Without the dataset or mpirun the test is skipped, or fails
// when CI=true.
func buildLaunchable(t *testing.T) (accelBin, demoBin string) {
	t.Helper()
	if _, err := os.Stat(fashionmnist.DefaultDir); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Fashion-MNIST is required in CI (apt-get install %s): %v", fashionmnist.DebianPackage, err)
		}
		t.Skipf("Fashion-MNIST not installed (apt-get install %s): %v", fashionmnist.DebianPackage, err)
	}
	mpitest.RequireMPIRun(t)
	return buildLauncherAndDemo(t)
}

// launchTwo runs the demo built by buildLaunchable under `accel launch -n 2` with args, the environment
// plus env, and returns its summary.
func launchTwo(t *testing.T, accelBin, demoBin string, env []string, args ...string) summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, accelBin, append([]string{"launch", "-n", "2", "--", demoBin}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Run(), "stdout: %s\nstderr: %s", out.String(), errOut.String())
	return parseSummary(t, out.String())
}

// TestLaunchCompressedGradients: the unchanged demo on 2 processes under `accel launch`, its gradients sent
// as bf16 or fp16 (GOACCEL_GRADIENT_COMPRESSION), reaches the test accuracy of the uncompressed run within
// 0.005, averaged over three seeds: one run's accuracy moves by a few thousandths with any perturbation of
// the training path (fp16, 8 times more precise than bf16, is as far from uncompressed on some seeds), and
// the mean over seeds is the comparison that says something about the precision. Each run takes the same
// optimizer steps, and its collectives carried about half the bytes (the all-reduces exactly half; the
// broadcast of the initial weights and the setting checks are not compressed).
func TestLaunchCompressedGradients(t *testing.T) {
	accelBin, demoBin := buildLaunchable(t)
	seeds := []string{"1", "2", "3"}
	meanAccuracy := map[string]float64{}
	runs := map[string][]summary{}
	for _, format := range []string{"none", "bf16", "fp16"} {
		for _, seed := range seeds {
			s := launchTwo(t, accelBin, demoBin, []string{"GOACCEL_GRADIENT_COMPRESSION=" + format},
				"-batch", "32", "-limit", "12000", "-epochs", "1", "-k", "2", "-quiet", "-seed", seed)
			runs[format] = append(runs[format], s)
			meanAccuracy[format] += float64(s.TestAccuracy) / float64(len(seeds))
		}
	}
	for _, format := range []string{"bf16", "fp16"} {
		assert.InDelta(t, meanAccuracy["none"], meanAccuracy[format], 0.005, "%s: mean test accuracy over seeds %v", format, seeds)
		for i, s := range runs[format] {
			plain := runs["none"][i]
			assert.Equal(t, 2, s.WorldSize)
			assert.Equal(t, plain.OptimizerSteps, s.OptimizerSteps, "%s, seed %s", format, seeds[i])
			assert.Equal(t, plain.Syncs, s.Syncs, "%s, seed %s", format, seeds[i])
			ratio := float64(s.CollectiveBytes) / float64(plain.CollectiveBytes)
			assert.True(t, ratio > 0.5 && ratio < 0.55, "%s, seed %s: %d bytes against %d uncompressed (%.3f)", format,
				seeds[i], s.CollectiveBytes, plain.CollectiveBytes, ratio)
			assert.NotEqual(t, plain.FinalLoss, s.FinalLoss, "%s, seed %s: the compressed run must differ", format, seeds[i])
		}
		t.Logf("mean test accuracy over seeds %v: uncompressed %.4f, %s %.4f", seeds, meanAccuracy["none"], format,
			meanAccuracy[format])
	}
}

// buildLauncherAndDemo builds `accel` and the demo with the mpi engine (accel's --check runs through it),
// and returns their paths.
func buildLauncherAndDemo(t *testing.T) (accelBin, demoBin string) {
	t.Helper()
	bin := t.TempDir()
	build := func(out, pkg string, tags ...string) string {
		args := append([]string{"build", "-o", filepath.Join(bin, out)}, tags...)
		cmd := exec.Command("go", append(args, pkg)...)
		cmd.Dir = "../.."
		output, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", output)
		return filepath.Join(bin, out)
	}
	return build("accel", "./cmd/accel", "-tags", "mpi"), build("grad_accum", "./examples/grad_accum", "-tags", "mpi")
}

// TestRankWithMissingDataEndsJob: when one process of a two-process job cannot load its data, the job ends
// with a non-zero exit code instead of leaving the other process in a collective until the watchdog; the
// failing process prints its error with its rank, and the other says which rank failed and why.
func TestRankWithMissingDataEndsJob(t *testing.T) {
	mpitest.RequireMPIRun(t)
	data := writeFakeDataset(t, 256, 64)
	bin := filepath.Join(t.TempDir(), "grad_accum")
	cmd := exec.Command("go", "build", "-tags", "mpi", "-o", bin, "./examples/grad_accum")
	cmd.Dir = "../.."
	output, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", output)

	// The job of the issue: `mpirun -np 1 grad_accum … : -np 1 grad_accum … -data /nonexistent`. A hung job
	// runs into the deadline and fails the test.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	common := []string{"-epochs", "1", "-batch", "8", "-k", "2", "-quiet"}
	args := append(append([]string{"-data", data}, common...), ":", "-np", "1", bin, "-data", "/nonexistent")
	var stdout, stderr bytes.Buffer
	job, err := launch.Command(ctx, 1, bin, append(args, common...), launch.WithStdio(nil, &stdout, &stderr),
		launch.WithCPUs(2))
	require.NoError(t, err)
	err = job.Run()
	require.NoError(t, ctx.Err(), "the job hung:\nstdout: %s\nstderr: %s", stdout.String(), stderr.String())
	require.Error(t, err, "the job must fail:\nstdout: %s\nstderr: %s", stdout.String(), stderr.String())
	out := stdout.String() + stderr.String()
	assert.NotZero(t, launch.ExitCode(err))
	assert.Regexp(t, `grad_accum: rank 1 of 2: .*/nonexistent`, out, "the failing rank prints its error")
	assert.Regexp(t, `grad_accum: rank 0 of 2: .*rank 1 failed: .*/nonexistent`, out, "the other rank names it")
	t.Logf("job ended with exit code %d", launch.ExitCode(err))
}
