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
	"github.com/goaccel/goaccel/internal/mpitest"
	"github.com/goaccel/goaccel/launch"
)

// TestLaunchTwoProcessesMatchesOne: the unchanged demo under `accel launch -n 2` reaches the same test
// accuracy (±0.01) as one process on the same data, epochs and global batch (2 × 32 = 64 examples per
// micro-batch), with the same number of optimizer steps — and its gradients really crossed processes.
func TestLaunchTwoProcessesMatchesOne(t *testing.T) {
	if _, err := os.Stat(fashionmnist.DefaultDir); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Fashion-MNIST is required in CI (apt-get install %s): %v", fashionmnist.DebianPackage, err)
		}
		t.Skipf("Fashion-MNIST not installed (apt-get install %s): %v", fashionmnist.DebianPackage, err)
	}
	mpitest.RequireMPIRun(t)
	accelBin, demoBin := buildLauncherAndDemo(t)

	common := []string{"-limit", "12000", "-epochs", "1", "-k", "2", "-quiet", "-seed", "5"}
	code, stdout, stderr := runMain(t, append([]string{"-batch", "64"}, common...)...)
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	single := parseSummary(t, stdout)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, accelBin, append([]string{"launch", "-n", "2", "--", demoBin, "-batch", "32"},
		common...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Run(), "stdout: %s\nstderr: %s", out.String(), errOut.String())
	double := parseSummary(t, out.String())

	assert.Equal(t, 2, double.WorldSize)
	assert.Equal(t, single.GlobalBatch, double.GlobalBatch)
	assert.Equal(t, single.OptimizerSteps, double.OptimizerSteps)
	assert.Positive(t, double.CollectiveCalls, "two processes must exchange gradients")
	assert.InDelta(t, single.TestAccuracy, double.TestAccuracy, 0.01,
		"1 process: %.4f, 2 processes: %.4f", single.TestAccuracy, double.TestAccuracy)
	t.Logf("test accuracy: 1 process %.4f, 2 processes %.4f", single.TestAccuracy, double.TestAccuracy)
}

// buildLauncherAndDemo builds `accel` and the demo with the mpi engine, and returns their paths.
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
	return build("accel", "./cmd/accel"), build("grad_accum", "./examples/grad_accum", "-tags", "mpi")
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
