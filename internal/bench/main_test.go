package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// buildWithMPI builds a command of this repository with -tags mpi into dir, as `make bench` does.
func buildWithMPI(ctx context.Context, t *testing.T, dir, pkg string) string {
	t.Helper()
	exe := filepath.Join(dir, filepath.Base(pkg))
	out, err := exec.CommandContext(ctx, "go", "build", "-tags", "mpi", "-o", exe, pkg).CombinedOutput()
	require.NoError(t, err, "go build -tags mpi %s (is libopenmpi-dev installed?):\n%s", pkg, out)
	return exe
}

// buildForTraining builds accelbench and the demo for a quick run that trains against PyTorch, with a
// context that bounds the test; it skips t (fails it with CI=true) without PyTorch or MPI, and in -short.
func buildForTraining(t *testing.T) (context.Context, string, string) {
	t.Helper()
	requirePyTorch(t)
	mpitest.RequireMPIRun(t)
	if testing.Short() {
		t.Skip("builds binaries and trains")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	dir := t.TempDir()
	return ctx, buildWithMPI(ctx, t, dir, "./cmd/accelbench"), buildWithMPI(ctx, t, dir, "../../examples/grad_accum")
}

// runQuick runs accelbench -quick with args and returns its standard output (benchstat lines), the report
// and the results.
func runQuick(ctx context.Context, t *testing.T, exe string, args ...string) (string, string, results) {
	t.Helper()
	return runQuickWith(t, func(quick []string) *exec.Cmd {
		return exec.CommandContext(ctx, exe, append(quick, args...)...)
	})
}

// runQuickWith is runQuick with the command made by command from accelbench's arguments.
func runQuickWith(t *testing.T, command func(args []string) *exec.Cmd) (string, string, results) {
	t.Helper()
	dir := t.TempDir()
	report, saved := filepath.Join(dir, "benchmarks.md"), filepath.Join(dir, "results.json")
	var stdout, stderr bytes.Buffer
	cmd := command([]string{"-quick", "-out", report, "-json", saved})
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "accelbench -quick:\n%s", stderr.String())
	md, err := os.ReadFile(report)
	require.NoError(t, err)
	data, err := os.ReadFile(saved)
	require.NoError(t, err)
	var res results
	require.NoError(t, json.Unmarshal(data, &res))
	// Standard output is benchstat input: configuration lines, then only benchmark lines.
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		ok := strings.HasPrefix(line, "Benchmark")
		for _, key := range []string{"goos", "goarch", "pkg", "cpu"} {
			ok = ok || strings.HasPrefix(line, key+": ")
		}
		assert.True(t, ok, "not a benchstat line: %q", line)
	}
	return stdout.String(), string(md), res
}

// TestQuick runs every section but the end-to-end one in -quick mode: mpirun with 2 ranks, the single
// process overhead, the compute children, the report and the JSON results. It proves the pipeline works;
// it asserts nothing about timings.
func TestQuick(t *testing.T) {
	mpitest.RequireMPIRun(t)
	if testing.Short() {
		t.Skip("builds a binary and runs mpirun")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	exe := buildWithMPI(ctx, t, t.TempDir(), "./cmd/accelbench")
	stdout, md, res := runQuick(ctx, t, exe, "-only", "mpi,overhead,compute")

	for _, name := range []string{"BenchmarkAllReduce/impl=mpi/", "BenchmarkAllReduce/impl=goaccel/",
		"BenchmarkGradientSync/bucketed/", "BenchmarkAccumulation/model=bow/accumulate/",
		"BenchmarkTrainStep/model=mlp/impl=gomlx/", "BenchmarkTrainStep/model=big-mlp/compute=go "} {
		assert.Contains(t, stdout, name)
	}
	for _, section := range []string{"## Summary", "### Big MLP", "## 1. All-reduce efficiency", "## 2. Bucketing",
		"## 3. Accumulation", "## 4. Overhead", "## 5. Overlap", "Smoke test"} {
		assert.Contains(t, md, section)
	}
	assert.NotContains(t, md, "### The demo's job", "not asked for")
	assert.True(t, res.Plan.Quick)
	assert.Len(t, res.AllReduce, len(res.Plan.AllReduceSizes))
	require.Len(t, res.Compute, len(computeConfigs))
	for _, c := range res.Compute {
		if c.Err != "" { // BLAS fails in a build without it, and says why
			assert.Contains(t, c.Err, "BLAS", c.Config.Name)
		} else {
			assert.Positive(t, c.PeakRSS, c.Config.Name)
			assert.Len(t, c.Steps.Seconds, res.Plan.Compute.MinSteps*res.Plan.Compute.Rounds, c.Config.Name)
		}
	}
	require.Len(t, res.Accumulation, 1)
	// The counters, unlike the timings, are exact: K× more all-reduces when syncing every micro-batch.
	a := res.Accumulation[0]
	calls := a.Accumulate.Extra[callsUnit]
	assert.Positive(t, calls)
	assert.Equal(t, float64(a.Config.K)*calls, a.SyncEachBatch.Extra[callsUnit])
	assert.Equal(t, float64(a.Config.K)*calls, a.SyncEveryMicroBatch.Extra[callsUnit])
}

// TestQuickEndToEnd runs the end-to-end section on a few hundred examples: the demo on 1 and 2 processes
// and the PyTorch script, the same way `make bench` runs them.
func TestQuickEndToEnd(t *testing.T) {
	ctx, exe, demo := buildForTraining(t)
	stdout, md, res := runQuick(ctx, t, exe, "-only", "e2e", "-demo", demo, "-limit", "256")

	assert.Contains(t, stdout, "BenchmarkEndToEnd/model=mlp/impl=pytorch/procs=2 ")
	assert.Contains(t, md, "## End to end against PyTorch")
	assert.Contains(t, md, "first 256 training examples only")
	assert.NotEmpty(t, res.Machine.PyTorch)
	p := res.Plan.EndToEnd
	require.Len(t, res.EndToEnd, len(p.Models)*len(p.Procs)*len(endToEndImpls))
	for _, r := range res.EndToEnd {
		require.Len(t, r.PerExample.Seconds, 1, "%s %s %d", r.Impl, r.Model, r.Procs)
		assert.Positive(t, r.PerExample.Seconds[0])
		assert.Equal(t, 256, r.PerExample.Iters, "examples × epochs")
		assert.InDelta(t, 0.5, r.TestAccuracy[0], 0.5)
	}
}

func TestRenderSavedResults(t *testing.T) {
	dir := t.TempDir()
	saved := filepath.Join(dir, "results.json")
	require.NoError(t, writeJSON(saved, syntheticResults()))
	var stderr bytes.Buffer
	out := filepath.Join(dir, "report.md")
	require.Equal(t, 0, Main([]string{"-render", saved, "-out", out}, &bytes.Buffer{}, &stderr), stderr.String())
	md, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, report(syntheticResults()), string(md), "the JSON round trip keeps everything the report shows")
}

func TestBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-ranks", "1"}, "world size of at least 2"},
		{[]string{"-only", "mpi,gpu"}, `unknown section "gpu" (want some of compute,demo,e2e,lstm,mpi,network,overhead,purego,resnet,sharding,transformer)`},
		{[]string{"-net", "eth0"}, "-launch-agent and -net describe the hosts of -hosts, which is not given"},
		{[]string{"-hosts", "a:x"}, `slots must be a whole number of at least 1, got "x"`},
		{[]string{"-hosts", "a:1", "-only", "mpi"}, "-hosts a:1: the MPI sections need at least 2 slots"},
		{[]string{"-hosts", "a:2", "-only", "network"}, "-hosts a:2: the network section needs at least 2 hosts"},
		{[]string{"-hosts", "a,b", "-ranks", "4"}, "-ranks: 4 processes do not fit the 2 slots of -hosts a,b"},
		{[]string{"-no-such-flag"}, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			assert.Equal(t, 2, Main(tt.args, &bytes.Buffer{}, &stderr))
			assert.Contains(t, stderr.String(), tt.want)
		})
	}
}
