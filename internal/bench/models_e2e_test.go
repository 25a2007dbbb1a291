package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	unsetCoreType(t)
	d := &driver{plan: p, progress: &bytes.Buffer{}, benchstat: &bytes.Buffer{}, numCPU: 2,
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
	assert.Contains(t, string(calls), "charlm_ddp.py --procs 1 --threads 2 --"+strings.ReplaceAll(job, " -", " --")+"\n",
		"PyTorch, equally fast on 1 and 2 threads, keeps matched threads")
	assert.Contains(t, string(calls), "charlm_ddp.py --procs 1 --threads 1 --"+strings.ReplaceAll(job, " -", " --")+"\n",
		"its calibration: the plan's 3 steps are fewer than the calibration's")
	assert.Equal(t, 3, strings.Count(string(calls), "charlm_ddp.py"), "2 calibration runs, 1 round")
	require.NotNil(t, pairs[0][1].PyTorch)
	assert.Equal(t, torchConfig{Threads: 2}, pairs[0][1].PyTorch.Chosen)

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

// TestResNetPlumbing drives the ResNet section with stand-ins for examples/resnet (both builds) and PyTorch
// (one process each, two rounds): the job's flags reach every program in its syntax, each round from its
// own seed, the summaries land in the results and the goals are judged from them; a summary without a
// throughput, an accuracy or the planned epochs fails the run.
func TestResNetPlumbing(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	summary := func(rate, accuracy, epochs string) string {
		return `echo "{\"train_examples\":256,\"epochs\":` + epochs + `,\"examples_per_second\":` + rate +
			`,\"test_accuracy\":` + accuracy + `,\"parameters\":1234}"`
	}
	p := quickPlan()
	require.NoError(t, p.only("resnet"))
	p.ResNet.Procs, p.ResNet.Rounds = []int{1}, 2
	var benchstat bytes.Buffer
	unsetCoreType(t)
	// PyTorch is faster on one thread of the two cores: its calibration chooses one.
	python := fakeProgram(t, dir, "python", log, `case "$*" in
*"--threads 1 "*) `+summary("1000", "0.80", "1")+` ;;
*) `+summary("800", "0.80", "1")+` ;;
esac`)
	d := &driver{plan: p, progress: &bytes.Buffer{}, benchstat: &benchstat, numCPU: 2,
		endToEnd: endToEndSetup{python: python, dataDir: "/data/fashion"},
		resNet: resNetSetup{resnet: fakeProgram(t, dir, "resnet", log, summary("1200", "0.805", "1")),
			resnetPureGo: fakeProgram(t, dir, "resnet_purego", log, summary("600", "0.79", "1"))}}
	res := &results{Plan: p}
	require.NoError(t, d.checkPrograms(context.Background(), res, dir), "only the stand-ins are needed")
	var err error
	res.ResNet, err = d.measureResNet(context.Background())
	require.NoError(t, err)

	require.Len(t, res.ResNet, 3)
	g, pure, torch := resNetRun(res, implGoaccel, 1), resNetRun(res, implGoaccelPureGo, 1), resNetRun(res, implPyTorch, 1)
	require.True(t, g != nil && pure != nil && torch != nil)
	assert.Equal(t, []float64{1.0 / 1200, 1.0 / 1200}, g.PerExample.Seconds)
	assert.Equal(t, []float64{0.79, 0.79}, pure.TestAccuracy)
	assert.Equal(t, 256, torch.PerExample.Iters)
	assert.Equal(t, 1234, g.Parameters)
	md := report(res)
	assert.Contains(t, md, "| End to end: ResNet throughput | goaccel ≥ 1.0× PyTorch DDP's examples/s, 1 and 2 processes | 1 process: 1.20× | **yes** |")
	assert.Contains(t, md, "| 1 process: 0.8050 vs 0.8000 | **yes** |")
	assert.Contains(t, md, "| 1 | 1200 ±0% | 600 ±0% | 1000 ±0% | 1.20× | 0.60× | 0.8050 | 0.7900 | 0.8000 | 2 |")
	assert.Contains(t, benchstat.String(), "BenchmarkResNet/impl=goaccel-purego/procs=1 ")

	calls, err := os.ReadFile(log)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(calls)), "\n")
	require.Len(t, lines, 9, "PyTorch's version, its calibration on 2 and 1 threads, then 2 rounds × 3 programs")
	job := func(dash string, seed int) string {
		return strings.ReplaceAll(fmt.Sprintf("-width 4 -blocks 1 -dropout 0.2 -epochs 1 -batch 32 -k 2 -lr 0.002 -seed %d "+
			"-limit 256 -data /data/fashion", seed), "-", dash)
	}
	for i, threads := range []string{"1", "2"} {
		assert.Regexp(t, `resnet_ddp\.py --procs 1 --threads `+threads+` `+regexp.QuoteMeta(job("--", 42))+"$", lines[1+i],
			"the calibration runs first")
	}
	for _, seed := range []int{42, 43} {
		assert.Contains(t, lines, " "+job("-", seed)+" -quiet", "both builds, seed %d", seed)
		assert.Regexp(t, `resnet_ddp\.py --procs 1 --threads 1 `+regexp.QuoteMeta(job("--", seed))+"\n", string(calls))
	}
	require.NotNil(t, torch.PyTorch)
	assert.Equal(t, torchConfig{Threads: 1}, torch.PyTorch.Chosen)
	assert.Contains(t, md, "| 1 process | 2 threads | 800 ±0% | 0.8000 |  |")
	assert.Contains(t, md, "| 1 process | 1 thread | 1000 ±0% | 0.8000 | **chosen** |")

	for name, bad := range map[string]string{
		"no examples/s": summary("0", "0.8", "1"),
		"no accuracy":   summary("1000", "null", "1"),
		"short":         summary("1000", "0.8", "2"),
		"not json":      `echo done`,
	} {
		t.Run(name, func(t *testing.T) {
			d.resNet.resnetPureGo = fakeProgram(t, t.TempDir(), "resnet_purego", log, bad)
			_, err := d.measureResNet(context.Background())
			assert.ErrorContains(t, err, "resnet with goaccel-purego on 1 process")
		})
	}
}

// TestLSTMPlumbing drives the LSTM section with stand-ins for examples/lstm and PyTorch (two rounds): PyTorch's
// calibration runs first on the job itself (smaller than the calibration's examples), the job's flags reach
// both programs in their syntax, each round from its own seed, the summaries land in the results and the
// page reports them with no goal; a summary without a throughput, a final loss or the planned epochs fails
// the run.
func TestLSTMPlumbing(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	summary := func(rate, loss, epochs string) string {
		return `echo "{\"train_examples\":128,\"epochs\":` + epochs + `,\"examples_per_second\":` + rate +
			`,\"final_loss\":` + loss + `,\"parameters\":321}"`
	}
	p := quickPlan()
	require.NoError(t, p.only("lstm"))
	p.LSTM.Rounds = 2
	var benchstat bytes.Buffer
	unsetCoreType(t)
	// PyTorch is faster on one thread of the two cores.
	python := fakeProgram(t, dir, "python", log, `case "$*" in
*"--threads 1 "*) `+summary("20000", "0.0003", "2")+` ;;
*) `+summary("16000", "0.0003", "2")+` ;;
esac`)
	d := &driver{plan: p, progress: &bytes.Buffer{}, benchstat: &benchstat, numCPU: 2,
		endToEnd: endToEndSetup{python: python},
		lstm:     lstmSetup{lstm: fakeProgram(t, dir, "lstm", log, summary("5000", "0.0002", "2"))}}
	res := &results{Plan: p}
	require.NoError(t, d.checkPrograms(context.Background(), res, dir), "only the stand-ins are needed")
	var err error
	res.LSTM, err = d.measureLSTM(context.Background())
	require.NoError(t, err)

	g, torch := lstmRun(res, implGoaccel), lstmRun(res, implPyTorch)
	require.True(t, g != nil && torch != nil)
	assert.Equal(t, []float64{1.0 / 5000, 1.0 / 5000}, g.PerExample.Seconds)
	assert.Equal(t, []float64{0.0003, 0.0003}, torch.FinalLoss)
	assert.Equal(t, 256, g.PerExample.Iters, "examples × epochs")
	assert.Equal(t, 321, torch.Parameters)
	require.NotNil(t, torch.PyTorch)
	assert.Equal(t, torchConfig{Threads: 1}, torch.PyTorch.Chosen)
	assert.Nil(t, g.PyTorch)
	md := report(res)
	assert.Contains(t, md, "### The LSTM")
	assert.Contains(t, md, "examples/lstm's job, reported, no goal")
	assert.Contains(t, md, "| 1 | 5000 ±0% | 20000 ±0% | 0.25× | 0.000200 | 0.000300 | 2 |")
	assert.Contains(t, md, "Both models have 321 parameters. Final losses by round (seed): goaccel 0.000200, 0.000200, "+
		"PyTorch 0.000300, 0.000300.")
	assert.Contains(t, md, "| 1 process | 1 thread | 20000 ±0% | 0.000300 | **chosen** |")
	assert.Contains(t, md, "on a shorter job (128 sequences, 2 epochs)")
	assert.Contains(t, md, "the LSTM is reported, no goal")
	for _, g := range goals(res) {
		assert.NotContains(t, g.what, "LSTM", "the LSTM has no goal")
	}
	assert.Contains(t, benchstat.String(), "BenchmarkLSTM/impl=pytorch ")

	calls, err := os.ReadFile(log)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(calls)), "\n")
	require.Len(t, lines, 7, "PyTorch's version, its calibration on 1 and 2 threads, then 2 rounds × 2 programs")
	job := func(dash string, seed int) string {
		return strings.ReplaceAll(fmt.Sprintf("-epochs 2 -batch 16 -examples 128 -length 8 -hidden 8 -lr 0.01 -seed %d", seed),
			"-", dash)
	}
	assert.Regexp(t, `lstm_sine\.py --procs 1 --threads 1 `+regexp.QuoteMeta(job("--", 42))+"$", lines[1])
	assert.Regexp(t, `lstm_sine\.py --procs 1 --threads 2 `+regexp.QuoteMeta(job("--", 42))+"$", lines[2])
	for _, seed := range []int{42, 43} {
		assert.Contains(t, lines, " "+job("-", seed)+" -quiet", "seed %d", seed)
		assert.Regexp(t, `lstm_sine\.py --procs 1 --threads 1 `+regexp.QuoteMeta(job("--", seed))+"\n", string(calls))
	}

	for name, bad := range map[string]string{
		"no examples/s": summary("0", "0.001", "2"),
		"diverged":      summary("1000", "null", "2"),
		"short":         summary("1000", "0.001", "1"),
		"not json":      `echo done`,
	} {
		t.Run(name, func(t *testing.T) {
			d.lstm.lstm = fakeProgram(t, t.TempDir(), "lstm", log, bad)
			_, err := d.measureLSTM(context.Background())
			assert.ErrorContains(t, err, "lstm with goaccel")
		})
	}
}

// TestLSTMNeedsItsProgram: without examples/lstm the section refuses to start, naming how to build it.
func TestLSTMNeedsItsProgram(t *testing.T) {
	dir := t.TempDir()
	s := lstmSetup{lstm: filepath.Join(dir, "missing")}
	assert.ErrorContains(t, s.check(dir), "go build -tags mpi,blas -o "+filepath.Join(dir, "missing")+" ./examples/lstm")
}

// TestResNetNeedsItsPrograms: without either build of examples/resnet the section refuses to start, naming
// how to build it.
func TestResNetNeedsItsPrograms(t *testing.T) {
	dir := t.TempDir()
	present := fakeProgram(t, dir, "resnet", filepath.Join(dir, "log"), `exit 0`)
	s := resNetSetup{resnet: present, resnetPureGo: filepath.Join(dir, "missing")}
	assert.ErrorContains(t, s.check(dir), "go build -tags mpi -o "+filepath.Join(dir, "missing")+" ./examples/resnet")
	s = resNetSetup{resnet: filepath.Join(dir, "missing"), resnetPureGo: present}
	assert.ErrorContains(t, s.check(dir), "go build -tags mpi,blas -o ")
}

// TestQuickModels runs the transformer, ResNet, LSTM, pure-Go CNN and demo sections for real in -quick mode:
// charlm and examples/resnet on 1 and 2 processes (mpirun), examples/lstm on 1, their PyTorch twins (each
// one-process row after its calibration), the demo built without BLAS under both convolution settings.
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
	resnet := buildWithMPI(ctx, t, dir, "../../examples/resnet")
	lstm := buildWithMPI(ctx, t, dir, "../../examples/lstm")
	// A small corpus keeps the runs short: one package of Go's own source.
	corpus := filepath.Join(defaultCorpus(), "strings")
	// The quick run checks the plumbing: this tree's demo stands in for the release's too.
	// The same build stands in for the ResNet's BLAS build.
	stdout, md, res := runQuick(ctx, t, exe, "-only", "transformer,resnet,lstm,purego,demo", "-charlm", charlm, "-demo", demo,
		"-demo-purego", demo, "-demo-purego-release", demo, "-corpus", corpus, "-resnet", resnet, "-resnet-purego", resnet,
		"-lstm", lstm)

	assert.Contains(t, stdout, "BenchmarkTransformer/impl=pytorch/procs=2 ")
	assert.Contains(t, stdout, "BenchmarkPureGoCNN/conv=kernel ")
	assert.Contains(t, stdout, "BenchmarkResNet/impl=pytorch/procs=2 ")
	assert.Contains(t, stdout, "BenchmarkLSTM/impl=pytorch ")
	for _, heading := range []string{"### The transformer language model", "### The ResNet", "### The LSTM",
		"### The demo's CNN without BLAS",
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
	require.Len(t, res.ResNet, len(resNetImpls)*len(res.Plan.ResNet.Procs))
	for _, r := range res.ResNet {
		require.Len(t, r.PerExample.Seconds, 1, "%s %d", r.Impl, r.Procs)
		assert.Equal(t, res.Plan.ResNet.Limit, r.PerExample.Iters, "%s %d: examples × epochs", r.Impl, r.Procs)
		assert.Greater(t, r.TestAccuracy[0], 0.0, "%s %d", r.Impl, r.Procs)
		assert.Equal(t, res.ResNet[0].Parameters, r.Parameters, "%s %d: the twins have the same parameters", r.Impl, r.Procs)
	}
	require.Len(t, res.LSTM, 2)
	for _, r := range res.LSTM {
		require.Len(t, r.PerExample.Seconds, 1, r.Impl)
		assert.Equal(t, res.Plan.LSTM.Examples*res.Plan.LSTM.Epochs, r.PerExample.Iters, r.Impl)
		assert.Positive(t, r.FinalLoss[0], r.Impl)
		assert.Equal(t, res.LSTM[0].Parameters, r.Parameters, "%s: the twins have the same parameters", r.Impl)
	}
	require.NotNil(t, res.LSTM[1].PyTorch, "PyTorch's configuration was chosen")
	for _, r := range res.ResNet {
		if r.Impl == implPyTorch {
			assert.NotNil(t, r.PyTorch, "resnet on %d: PyTorch's configuration was chosen", r.Procs)
		}
	}
	require.Len(t, res.PureGoCNN, 3)
	require.NotNil(t, res.Demo)
	assert.Positive(t, res.Demo.Wall.median())
}
