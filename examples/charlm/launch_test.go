package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// TestMPIRunSeveralProcesses: under a real mpirun of 2 and of 4 processes, the unchanged program trains
// with gradients that cross processes, every rank ends with bitwise-identical weights (the program checks
// its replicas before evaluating, and fails otherwise), only the main process prints the summary, and the
// validation loss is the one process's at the same global batch (N × 8/N windows against 1 × 8).
func TestMPIRunSeveralProcesses(t *testing.T) {
	mpitest.RequireMPIRun(t)
	bin := filepath.Join(t.TempDir(), "charlm")
	build := exec.Command("go", "build", "-tags", "mpi", "-o", bin, "./examples/charlm")
	build.Dir = "../.."
	output, err := build.CombinedOutput()
	require.NoError(t, err, "%s", output)

	root := tinyCorpus(t)
	common := []string{"-data", root, "-context", "16", "-dmodel", "32", "-heads", "2", "-blocks", "1",
		"-steps", "12", "-warmup", "2", "-k", "2", "-lr", "0.01", "-limit", "64", "-eval-windows", "20", "-seed", "11"}
	code, stdout, stderr := runMain(t, append([]string{"-batch", "8"}, common...)...)
	require.Equal(t, exitOK, code, "stderr: %s", stderr)
	single := parseSummary(t, stdout)

	for _, processes := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d processes", processes), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var out, errOut bytes.Buffer
			job, err := launch.Command(ctx, processes, bin, append([]string{"-batch", fmt.Sprint(8 / processes)}, common...),
				launch.WithStdio(nil, &out, &errOut), launch.WithCPUs(2))
			require.NoError(t, err)
			require.NoError(t, job.Run(), "stdout: %s\nstderr: %s", out.String(), errOut.String())
			several := parseSummary(t, out.String())

			assert.Equal(t, 1, strings.Count(out.String(), `{"rank":`), "one summary line, from the main process:\n%s", out.String())
			assert.Equal(t, 0, several.Rank)
			assert.Equal(t, processes, several.WorldSize)
			assert.Equal(t, single.GlobalBatch, several.GlobalBatch)
			assert.Equal(t, single.Steps, several.Steps)
			assert.Equal(t, single.TrainExamples, several.TrainExamples, "the tokens of every process count")
			assert.Positive(t, several.CollectiveCalls, "the processes must exchange gradients")
			// The same job cut differently: float32 sums in another order, nothing more.
			assert.InDelta(t, float64(single.ValidationLoss), float64(several.ValidationLoss), 0.02,
				"1 process: %.4f, %d processes: %.4f", single.ValidationLoss, processes, several.ValidationLoss)
			t.Logf("validation loss: 1 process %.4f, %d processes %.4f", single.ValidationLoss, processes,
				several.ValidationLoss)
		})
	}
}
