package bench

import (
	"bytes"
	"context"
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

// fakeProgram writes an executable shell script that appends its arguments and GOACCEL_CONV to log and
// prints output, and returns its path.
func fakeProgram(t *testing.T, dir, name, log, output string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	script := "#!/bin/sh\necho \"$GOACCEL_CONV $*\" >> " + log + "\n" + output + "\n"
	require.NoError(t, os.WriteFile(path, []byte(script), 0o755))
	return path
}

// TestPureGoAndDemoPlumbing drives the pure-Go CNN and demo measurements with stand-in programs: the
// release's demo and this tree's, the latter with each GOACCEL_CONV value, all with the plan's flags; the
// summaries land in the results, and the goals are judged from them.
func TestPureGoAndDemoPlumbing(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	// This tree's convolution executor is 8× faster than the release, the graph lowering 2×; any other
	// GOACCEL_CONV value fails the run. The release's stand-in ignores the variable, as the release did.
	demo := fakeProgram(t, dir, "demo", log, `case "$GOACCEL_CONV" in
graph) rate=100 ;;
kernel) rate=400 ;;
"") rate=50 ;;
*) exit 3 ;;
esac
echo progress line
echo "{\"train_examples\":256,\"epochs\":1,\"train_seconds\":2.5,\"examples_per_second\":$rate,\"test_accuracy\":0.5}"`)
	release := fakeProgram(t, dir, "release", log, `echo "{\"train_examples\":256,\"epochs\":1,\"train_seconds\":5,\"examples_per_second\":50,\"test_accuracy\":0.5}"`)
	p := quickPlan()
	require.NoError(t, p.only("purego,demo"))
	p.PureGoCNN.Rounds = 2
	var progress, benchstat bytes.Buffer
	d := &driver{plan: p, progress: &progress, benchstat: &benchstat,
		endToEnd: endToEndSetup{demo: demo, demoPureGo: demo, demoPureGoRelease: release, dataDir: "/data/fashion"}}
	ctx := context.Background()
	res := &results{Plan: p}
	require.NoError(t, d.checkPrograms(ctx, &results{}, dir), "only the stand-in programs are needed")
	var err error
	res.PureGoCNN, err = d.measurePureGo(ctx)
	require.NoError(t, err)
	res.Demo, err = d.measureDemo(ctx)
	require.NoError(t, err)

	require.Len(t, res.PureGoCNN, 3)
	assert.Equal(t, pureGoVariant{Release: pureGoBaseline}, res.PureGoCNN[0].Variant, "the baseline comes first")
	assert.Equal(t, []float64{1.0 / 50, 1.0 / 50}, res.PureGoCNN[0].PerExample.Seconds)
	assert.Equal(t, []float64{1.0 / 400, 1.0 / 400}, res.PureGoCNN[2].PerExample.Seconds)
	assert.Equal(t, 256, res.PureGoCNN[0].PerExample.Iters)
	q, ok := pureGoSpeedup(res)
	require.True(t, ok)
	assert.InDelta(t, 8, q, 1e-9)
	require.NotNil(t, res.Demo)
	assert.Len(t, res.Demo.Wall.Seconds, 1)
	assert.Positive(t, res.Demo.Wall.Seconds[0])
	assert.Equal(t, []float64{2.5}, res.Demo.TrainSeconds)

	calls, err := os.ReadFile(log)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(calls)), "\n")
	require.Len(t, lines, 7, "2 rounds × 3 variants, then the demo once")
	for _, line := range lines[:6] {
		assert.Regexp(t, `^(graph|kernel|) -model cnn -epochs 1 -batch 64 -k 4 -lr 0.002 -seed 42 -limit 256 `+
			`-data /data/fashion -quiet$`, line)
	}
	assert.Equal(t, " -model mlp -epochs 1 -limit 512 -data /data/fashion -quiet", lines[6], "the demo runs without GOACCEL_CONV")
	assert.Contains(t, benchstat.String(), "BenchmarkPureGoCNN/conv=kernel ")
	assert.Contains(t, benchstat.String(), "BenchmarkPureGoCNN/release="+pureGoBaseline+" ")
	assert.Contains(t, benchstat.String(), "BenchmarkDemo/args=-model_mlp_-epochs_1_-limit_512 ")

	md := report(res)
	assert.Contains(t, md, "| 8.00× | **yes** |")
	assert.Contains(t, md, "| `GOACCEL_CONV=kernel` | 400 ±0% | 8.00× | 0.5000 | 2 |")
	assert.Contains(t, md, "| goaccel "+pureGoBaseline+" (built from its source) | 50 ±0% | 1.00× | 0.5000 | 2 |")
}

// TestPureGoNeedsTheRelease: without the release's demo the section refuses to start, naming it.
func TestPureGoNeedsTheRelease(t *testing.T) {
	dir := t.TempDir()
	demo := fakeProgram(t, dir, "demo", filepath.Join(dir, "log"), `exit 0`)
	err := checkDemoPureGo(quickPlan().PureGoCNN, endToEndSetup{demoPureGo: demo,
		demoPureGoRelease: filepath.Join(dir, "missing")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "goaccel "+pureGoBaseline+"'s demo")
}

// TestPureGoRunFailure: a variant whose program fails stops the section with the program's command line.
func TestPureGoRunFailure(t *testing.T) {
	dir := t.TempDir()
	demo := fakeProgram(t, dir, "demo", filepath.Join(dir, "log"), `echo "no GPU" >&2; exit 3`)
	p := quickPlan()
	d := &driver{plan: p, progress: &bytes.Buffer{}, benchstat: &bytes.Buffer{},
		endToEnd: endToEndSetup{demoPureGo: demo, demoPureGoRelease: demo, dataDir: dir}}
	_, err := d.measurePureGo(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "GOACCEL_CONV=")
	assert.Contains(t, err.Error(), "exit status 3")
}

// TestTransformerPlumbing drives the transformer section with stand-ins for charlm and PyTorch (one
// process each): the job's flags reach both in their syntax, and a summary without the planned steps or
// with a diverged loss fails the run.
func TestTransformerPlumbing(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	summary := func(tokens, loss string) string {
		return `echo "{\"steps\":3,\"train_tokens\":384,\"tokens_per_second\":` + tokens + `,\"validation_loss\":` + loss +
			`,\"parameters\":1234}"`
	}
	p := quickPlan()
	p.Transformer.Procs = []int{1}
	d := &driver{plan: p, progress: &bytes.Buffer{}, benchstat: &bytes.Buffer{},
		endToEnd:    endToEndSetup{python: fakeProgram(t, dir, "python", log, summary("2000", "3.0"))},
		transformer: transformerSetup{charlm: fakeProgram(t, dir, "charlm", log, summary("1000", "3.03")), corpus: dir}}
	require.NoError(t, d.transformer.check(dir))
	runs, err := d.measureTransformer(context.Background())
	require.NoError(t, err)
	res := &results{Plan: p, Transformer: runs}
	pairs := transformerPairs(res)
	require.Len(t, pairs, 1)
	assert.InDelta(t, 0.5, pairs[0][0].tokensPerSecond()/pairs[0][1].tokensPerSecond(), 1e-9)
	assert.InDelta(t, 0.01, lossGap(pairs[0]), 1e-9)
	assert.Contains(t, report(res), "| 1 process: 3.0300 vs 3.0000 (+1.0%) | **yes** |")

	calls, err := os.ReadFile(log)
	require.NoError(t, err)
	job := "context 16 -dmodel 16 -heads 2 -blocks 1 -batch 4 -k 2 -steps 3 -warmup 1 -lr 0.002 -wd 0.01 -clip 1 -seed 42 " +
		"-limit 64 -eval-windows 8 -data " + dir
	assert.Contains(t, string(calls), " -"+job+" -quiet\n")
	assert.Contains(t, string(calls), "charlm_ddp.py --procs 1 --threads ")
	assert.Contains(t, string(calls), " --"+strings.ReplaceAll(job, " -", " --")+"\n")

	for name, bad := range map[string]string{
		"diverged":    summary("1000", "null"),
		"short":       `echo '{"steps":2,"train_tokens":384,"tokens_per_second":1000,"validation_loss":3,"parameters":1}'`,
		"not json":    `echo done`,
		"no tokens/s": summary("0", "3.0"),
	} {
		t.Run(name, func(t *testing.T) {
			d.transformer.charlm = fakeProgram(t, t.TempDir(), "charlm", log, bad)
			_, err := d.measureTransformer(context.Background())
			assert.Error(t, err)
		})
	}
}

// TestQuickModels runs the transformer, pure-Go CNN and demo sections for real in -quick mode: charlm on 1
// and 2 processes (mpirun), its PyTorch twin, the demo built without BLAS under both convolution settings.
func TestQuickModels(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import torch").Run(); err != nil {
		// Not even under CI=true: CI does not install PyTorch, which only `make bench` needs.
		t.Skip("PyTorch is not installed (apt-get install python3-torch): the comparison with PyTorch is not tested")
	}
	mpitest.RequireMPIRun(t)
	if testing.Short() {
		t.Skip("builds binaries and trains")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	exe := buildWithMPI(ctx, t, dir, "./cmd/accelbench")
	charlm := buildWithMPI(ctx, t, dir, "../../examples/charlm")
	demo := buildWithMPI(ctx, t, dir, "../../examples/grad_accum") // -tags mpi only: no BLAS
	// A small corpus keeps the runs short: one package of Go's own source.
	corpus := filepath.Join(defaultCorpus(), "strings")
	// The quick run checks the plumbing: this tree's demo stands in for the release's too.
	stdout, md, res := runQuick(ctx, t, exe, "-only", "transformer,purego,demo", "-charlm", charlm, "-demo", demo,
		"-demo-purego", demo, "-demo-purego-release", demo, "-corpus", corpus)

	assert.Contains(t, stdout, "BenchmarkTransformer/impl=pytorch/procs=2 ")
	assert.Contains(t, stdout, "BenchmarkPureGoCNN/conv=kernel ")
	for _, heading := range []string{"### The transformer language model", "### The demo's CNN without BLAS",
		"### The demo's wall time"} {
		assert.Contains(t, md, heading)
	}
	require.Len(t, res.Transformer, 4)
	for _, r := range res.Transformer {
		require.Len(t, r.PerToken.Seconds, 1, "%s %d", r.Impl, r.Procs)
		assert.EqualValues(t, res.Plan.Transformer.Steps, r.Steps)
		assert.Positive(t, r.ValidationLoss[0])
	}
	pairs := transformerPairs(&res)
	require.Len(t, pairs, 2)
	assert.Equal(t, pairs[0][0].Parameters, pairs[0][1].Parameters, "the twins have the same parameters")
	require.Len(t, res.PureGoCNN, 3)
	require.NotNil(t, res.Demo)
	assert.Positive(t, res.Demo.Wall.median())
}
