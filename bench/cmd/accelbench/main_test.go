package main

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

	"github.com/goaccel/goaccel/bench"
	"github.com/goaccel/goaccel/internal/mpitest"
)

// TestQuickEndToEnd builds the driver with -tags mpi, as `make bench` does, and runs it in -quick mode:
// mpirun with 2 ranks, every measurement once with tiny sizes, the report and the JSON results. It proves
// the pipeline works; it asserts nothing about timings.
func TestQuickEndToEnd(t *testing.T) {
	mpitest.RequireMPIRun(t)
	if testing.Short() {
		t.Skip("builds a binary and runs mpirun")
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "accelbench")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-tags", "mpi", "-o", exe, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build -tags mpi (is libopenmpi-dev installed?):\n%s", out)

	report, results := filepath.Join(dir, "benchmarks.md"), filepath.Join(dir, "results.json")
	var stdout, stderr bytes.Buffer
	run := exec.CommandContext(ctx, exe, "-quick", "-out", report, "-json", results)
	run.Stdout, run.Stderr = &stdout, &stderr
	require.NoError(t, run.Run(), "accelbench -quick:\n%s", stderr.String())

	// Standard output is benchstat input: configuration lines, then only benchmark lines.
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	require.NotEmpty(t, lines)
	for _, line := range lines {
		ok := strings.HasPrefix(line, "Benchmark") || strings.HasPrefix(line, "goos: ") ||
			strings.HasPrefix(line, "goarch: ") || strings.HasPrefix(line, "pkg: ") || strings.HasPrefix(line, "cpu: ") ||
			strings.HasPrefix(line, "goaccel: ")
		assert.True(t, ok, "not a benchstat line: %q", line)
	}
	assert.Contains(t, stdout.String(), "goaccel: with-fixes\n", "what-if samples are kept apart for benchstat")
	for _, name := range []string{"BenchmarkAllReduce/impl=mpi/", "BenchmarkAllReduce/impl=goaccel/",
		"BenchmarkGradientSync/bucketed/", "BenchmarkAccumulation/accumulate/", "BenchmarkTrainStep/model=mlp/impl=gomlx/"} {
		assert.Contains(t, stdout.String(), name)
	}

	md, err := os.ReadFile(report)
	require.NoError(t, err)
	for _, section := range []string{"## Summary", "## 1. All-reduce efficiency", "## 2. Bucketing",
		"## 3. Accumulation", "## 4. Overhead", "## 5. Overlap", "Smoke test"} {
		assert.Contains(t, string(md), section)
	}

	data, err := os.ReadFile(results)
	require.NoError(t, err)
	var res bench.Results
	require.NoError(t, json.Unmarshal(data, &res))
	assert.True(t, res.Plan.Quick)
	require.NotNil(t, res.WithFixes, "the what-if run with the recommended fixes")
	assert.Len(t, res.WithFixes.AllReduce, len(res.Plan.AllReduceSizes))
	assert.Len(t, res.Shipped.AllReduce, len(res.Plan.AllReduceSizes))
	require.Len(t, res.Shipped.Accumulation, 1)
	a := res.Shipped.Accumulation[0]
	// The counters, unlike the timings, are exact: K× more all-reduces when syncing every micro-batch.
	assert.Positive(t, a.Calls[a.Accumulate.Name])
	assert.Equal(t, float64(a.Config.K)*a.Calls[a.Accumulate.Name], a.Calls[a.SyncEachBatch.Name])
	assert.Equal(t, float64(a.Config.K)*a.Calls[a.Accumulate.Name], a.Calls[a.SyncEveryMicroBatch.Name])
}

// TestRenderSavedResults re-renders a saved report without measuring.
func TestRenderSavedResults(t *testing.T) {
	dir := t.TempDir()
	saved := filepath.Join(dir, "results.json")
	data, err := json.Marshal(bench.Results{Plan: bench.QuickPlan()})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(saved, data, 0o644))
	var stderr bytes.Buffer
	out := filepath.Join(dir, "report.md")
	require.Equal(t, 0, run([]string{"-render", saved, "-out", out}, &bytes.Buffer{}, &stderr), stderr.String())
	md, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Contains(t, string(md), "# goaccel benchmarks")
}

func TestBadRanks(t *testing.T) {
	var stderr bytes.Buffer
	assert.Equal(t, 2, run([]string{"-ranks", "1"}, &bytes.Buffer{}, &stderr))
	assert.Contains(t, stderr.String(), "world size of at least 2")
}
