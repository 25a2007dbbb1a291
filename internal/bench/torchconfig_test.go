package bench

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unsetCoreType removes OPENBLAS_CORETYPE from the test's environment (restored after it), so that PyTorch's
// candidates do not depend on the machine the tests run on.
func unsetCoreType(t *testing.T) {
	t.Helper()
	t.Setenv(openBLASCoreType, "") // restores the variable after the test
	require.NoError(t, os.Unsetenv(openBLASCoreType))
}

func TestTorchCandidates(t *testing.T) {
	tests := []struct {
		name            string
		cores, procs    int
		coreType        string
		want            []torchConfig
		wantDescription []string
	}{
		{"1 process on 2 cores", 2, 1, "", []torchConfig{{Threads: 2}, {Threads: 1}}, []string{"2 threads", "1 thread"}},
		{"2 processes on 2 cores: one thread each, nothing to choose", 2, 2, "", []torchConfig{{Threads: 1}}, []string{"1 thread"}},
		{"4 processes on 2 cores: still one thread", 2, 4, "", []torchConfig{{Threads: 1}}, []string{"1 thread"}},
		{"2 processes on 8 cores", 8, 2, "", []torchConfig{{Threads: 4}, {Threads: 3}, {Threads: 2}, {Threads: 1}}, nil},
		{"OPENBLAS_CORETYPE set: each thread count with and without it", 2, 1, "Haswell",
			[]torchConfig{{Threads: 2}, {Threads: 2, UnsetCoreType: true}, {Threads: 1}, {Threads: 1, UnsetCoreType: true}},
			[]string{"2 threads", "2 threads, OPENBLAS_CORETYPE unset", "1 thread", "1 thread, OPENBLAS_CORETYPE unset"}},
		{"OPENBLAS_CORETYPE set, 2 processes on 2 cores", 2, 2, "Haswell",
			[]torchConfig{{Threads: 1}, {Threads: 1, UnsetCoreType: true}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := torchCandidates(tt.cores, tt.procs, tt.coreType)
			assert.Equal(t, tt.want, got)
			if tt.wantDescription != nil {
				var names []string
				for _, c := range got {
					names = append(names, c.String())
				}
				assert.Equal(t, tt.wantDescription, names)
			}
		})
	}
}

func TestQualityCheck(t *testing.T) {
	accuracy := qualityCheck{Name: "test accuracy", Tolerance: 0.01}
	loss := qualityCheck{Name: "validation loss", Tolerance: 0.02, Relative: true}
	tests := []struct {
		name     string
		check    qualityCheck
		got, ref float64
		want     bool
	}{
		{"accuracy equal", accuracy, 0.85, 0.85, true},
		{"accuracy 0.01 below", accuracy, 0.84, 0.85, true},
		{"accuracy 0.01 above", accuracy, 0.86, 0.85, true},
		{"accuracy 0.011 below", accuracy, 0.839, 0.85, false},
		{"accuracy of a broken kernel", accuracy, 0.1, 0.85, false},
		{"accuracy NaN", accuracy, math.NaN(), 0.85, false},
		{"loss 2% higher", loss, 2.04, 2.0, true},
		{"loss 2% lower", loss, 1.96, 2.0, true},
		{"loss 2.5% higher", loss, 2.05, 2.0, false},
		{"loss infinite", loss, math.Inf(1), 2.0, false},
		{"reference NaN", loss, 2.0, math.NaN(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.check.agrees(tt.got, tt.ref))
		})
	}
	assert.Equal(t, "0.01", accuracy.tolerance())
	assert.Equal(t, "2%", loss.tolerance())
}

// cand is a calibrated candidate: examples/s and accuracy of each run.
func cand(threads int, unset bool, rate, accuracy float64) torchCandidate {
	return torchCandidate{Config: torchConfig{Threads: threads, UnsetCoreType: unset},
		PerUnit: constant("c", 1/rate), Quality: []float64{accuracy, accuracy, accuracy}}
}

func TestChooseTorch(t *testing.T) {
	check := qualityCheck{Name: "test accuracy", Tolerance: 0.01}
	failed := func(threads int) torchCandidate {
		return torchCandidate{Config: torchConfig{Threads: threads, UnsetCoreType: true}, Err: "exit status 132"}
	}
	tests := []struct {
		name     string
		cands    []torchCandidate
		want     int
		eligible []bool
		why      []string
	}{
		{"one thread faster", []torchCandidate{cand(2, false, 4700, 0.85), cand(1, false, 6100, 0.85)}, 1,
			[]bool{true, true}, []string{"", ""}},
		{"two threads faster", []torchCandidate{cand(2, false, 9000, 0.85), cand(1, false, 6100, 0.85)}, 0,
			[]bool{true, true}, []string{"", ""}},
		{"a tie keeps the first: matched threads", []torchCandidate{cand(2, false, 5000, 0.85), cand(1, false, 5000, 0.85)}, 0,
			[]bool{true, true}, []string{"", ""}},
		{"without OPENBLAS_CORETYPE faster and correct", []torchCandidate{cand(1, false, 5000, 0.85), cand(1, true, 8000, 0.846)}, 1,
			[]bool{true, true}, []string{"", ""}},
		{"without OPENBLAS_CORETYPE faster but wrong", []torchCandidate{cand(1, false, 5000, 0.85), cand(1, true, 8000, 0.10)}, 0,
			[]bool{true, false}, []string{"", "test accuracy 0.1000 against 0.8500 with OPENBLAS_CORETYPE"}},
		{"checked against the same threads", []torchCandidate{
			cand(2, false, 4000, 0.70), cand(2, true, 4500, 0.85), cand(1, false, 5000, 0.85), cand(1, true, 5500, 0.85)}, 3,
			[]bool{true, false, true, true},
			[]string{"", "test accuracy 0.8500 against 0.7000 with OPENBLAS_CORETYPE", "", ""}},
		{"without OPENBLAS_CORETYPE fails", []torchCandidate{cand(1, false, 5000, 0.85), failed(1)}, 0,
			[]bool{true, false}, []string{"", "failed: exit status 132"}},
		{"nothing to check against", []torchCandidate{cand(2, false, 5000, 0.85), cand(1, true, 8000, 0.85)}, 0,
			[]bool{true, false}, []string{"", "no run with OPENBLAS_CORETYPE of 1 thread to check it against"}},
		{"medians decide", []torchCandidate{
			{Config: torchConfig{Threads: 2}, PerUnit: series{Seconds: []float64{1.0 / 6000, 1.0 / 4000, 1.0 / 4000}},
				Quality: []float64{0.85}},
			{Config: torchConfig{Threads: 1}, PerUnit: series{Seconds: []float64{1.0 / 5000, 1.0 / 5000, 1.0 / 3000}},
				Quality: []float64{0.85}}}, 1,
			[]bool{true, true}, []string{"", ""}},
		{"not run", []torchCandidate{{Config: torchConfig{Threads: 1}}}, -1, []bool{false}, []string{"not run"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := chooseTorch(tt.cands, check)
			assert.Equal(t, tt.want, got)
			var eligible []bool
			var why []string
			for _, c := range tt.cands {
				eligible, why = append(eligible, c.Eligible), append(why, c.Why)
			}
			assert.Equal(t, tt.eligible, eligible)
			assert.Equal(t, tt.why, why)
		})
	}
}

// fakePyTorch writes a stand-in for the Python with PyTorch: it logs OPENBLAS_CORETYPE and its arguments to
// log and ends with a summary line whose examples/s and test accuracy depend on its --threads and on whether
// OPENBLAS_CORETYPE is set, as figures gives them ("THREADS/set" or "THREADS/unset" → "RATE ACCURACY", or
// "fail"); `-c ...` prints a version.
func fakePyTorch(t *testing.T, dir, log string, figures map[string]string) string {
	t.Helper()
	var cases strings.Builder
	for _, key := range slices.Sorted(maps.Keys(figures)) {
		f := figures[key]
		if f == "fail" {
			fmt.Fprintf(&cases, "%s) echo 'Illegal instruction' >&2; exit 132 ;;\n", key)
			continue
		}
		var rate, accuracy string
		_, err := fmt.Sscan(f, &rate, &accuracy)
		require.NoError(t, err, f)
		fmt.Fprintf(&cases, "%s) echo '{\"train_examples\":512,\"epochs\":1,\"examples_per_second\":%s,\"test_accuracy\":%s,\"parameters\":7}' ;;\n",
			key, rate, accuracy)
	}
	path := filepath.Join(dir, "python")
	script := `#!/bin/sh
[ "$1" = -c ] && { echo 1.13.1; exit 0; }
echo "${OPENBLAS_CORETYPE-(unset)} $*" >> ` + log + `
threads=$(echo "$*" | sed -n 's/.*--threads \([0-9]*\).*/\1/p')
core=set; [ -z "${OPENBLAS_CORETYPE+x}" ] && core=unset
case "$threads/$core" in
` + cases.String() + `*) echo "no figures for $threads/$core" >&2; exit 2 ;;
esac
`
	require.NoError(t, os.WriteFile(path, []byte(script), 0o755))
	return path
}

// TestPyTorchCalibration drives the end-to-end section's calibration with a stand-in for PyTorch whose
// speed and accuracy depend on its threads and OPENBLAS_CORETYPE: the candidates run first, interleaved, on
// the calibration's examples from the plan's seed; the fastest eligible one runs the rounds and decides the
// goal; the page lists the candidates.
func TestPyTorchCalibration(t *testing.T) {
	tests := []struct {
		name     string
		coreType string // "": unset
		procs    int
		rounds   int // calibration rounds
		figures  map[string]string
		// calibration is the configurations of the calibration runs, in order ("THREADS/OPENBLAS_CORETYPE"):
		// interleaved, the second round of a pair in the first's reverse order.
		calibration []string
		chosen      torchConfig
		measured    string // the round's configuration, as calibration lists them
		goal        string // the MLP's 1-process goal row's measured figure (goaccel trains at 1500 examples/s)
		page        []string
	}{
		{name: "one thread faster", procs: 1, rounds: 1,
			figures:     map[string]string{"1/unset": "1000 0.80", "2/unset": "800 0.80"},
			calibration: []string{"1/(unset)", "2/(unset)"}, chosen: torchConfig{Threads: 1}, measured: "1/(unset)",
			goal: "| 1.50× | **yes** |",
			page: []string{
				"`OPENBLAS_CORETYPE` is not set in the environment, so there is no run without it to compare.",
				"each candidate trained 1 time(s) on a shorter job (256 training examples)",
				"| MLP, 1 process | 2 threads | 800 ±0% | 0.8000 |  |",
				"| MLP, 1 process | 1 thread | 1000 ±0% | 0.8000 | **chosen** |",
			}},
		{name: "two threads faster, two rounds", procs: 1, rounds: 2,
			figures:     map[string]string{"1/unset": "1000 0.80", "2/unset": "1250 0.80"},
			calibration: []string{"1/(unset)", "2/(unset)", "2/(unset)", "1/(unset)"}, chosen: torchConfig{Threads: 2},
			measured: "2/(unset)", goal: "| 1.20× (25% short) | no |",
			page: []string{"| MLP, 1 process | 2 threads | 1250 ±0% | 0.8000 | **chosen** |"}},
		{name: "two processes on two cores: nothing to calibrate", procs: 2, rounds: 1,
			figures:  map[string]string{"1/unset": "1000 0.80"},
			chosen:   torchConfig{Threads: 1},
			measured: "1/(unset)",
			page:     []string{"| MLP, 2 processes | 1 thread | — | — | **chosen** (the only candidate) |"}},
		{name: "no calibration rounds: matched threads", procs: 1, rounds: 0,
			figures: map[string]string{"2/unset": "1000 0.80"}, chosen: torchConfig{Threads: 2}, measured: "2/(unset)",
			goal: "| 1.50× | **yes** |",
			page: []string{"Without calibration rounds the rows ran with cores / processes threads.",
				"| MLP, 1 process | 2 threads | — | — | **chosen** (not calibrated) |"}},
		{name: "without OPENBLAS_CORETYPE faster and correct", coreType: "Haswell", procs: 1, rounds: 1,
			figures: map[string]string{"1/set": "1000 0.80", "1/unset": "1500 0.795", "2/set": "700 0.80",
				"2/unset": "900 0.80"},
			calibration: []string{"2/(unset)", "2/Haswell", "1/(unset)", "1/Haswell"},
			chosen:      torchConfig{Threads: 1, UnsetCoreType: true}, measured: "1/(unset)", goal: "| 1.00× (50% short) | no |",
			page: []string{
				"each with `OPENBLAS_CORETYPE=Haswell` as the environment sets it (goaccel runs with it) and without it. " +
					"A candidate without it is eligible only when its test accuracy is within 0.01 of that of the run " +
					"with it on the same threads.",
				"| MLP, 1 process | 1 thread, OPENBLAS_CORETYPE unset | 1500 ±0% | 0.7950 | **chosen** |",
				"| MLP, 1 process | 1 thread | 1000 ±0% | 0.8000 |  |",
			}},
		{name: "without OPENBLAS_CORETYPE faster but wrong", coreType: "Haswell", procs: 1, rounds: 1,
			figures: map[string]string{"1/set": "1000 0.80", "1/unset": "3000 0.10", "2/set": "700 0.80",
				"2/unset": "900 0.80"},
			calibration: []string{"2/(unset)", "2/Haswell", "1/(unset)", "1/Haswell"},
			chosen:      torchConfig{Threads: 1}, measured: "1/Haswell", goal: "| 1.50× | **yes** |",
			page: []string{
				"| MLP, 1 process | 1 thread, OPENBLAS_CORETYPE unset | 3000 ±0% | 0.1000 | not eligible: test accuracy " +
					"0.1000 against 0.8000 with OPENBLAS_CORETYPE |",
				"| MLP, 1 process | 1 thread | 1000 ±0% | 0.8000 | **chosen** |",
			}},
		{name: "without OPENBLAS_CORETYPE crashes", coreType: "Haswell", procs: 2, rounds: 2,
			figures:     map[string]string{"1/set": "1000 0.80", "1/unset": "fail"},
			calibration: []string{"1/(unset)", "1/Haswell", "1/Haswell"}, chosen: torchConfig{Threads: 1},
			measured: "1/Haswell",
			page: []string{"| MLP, 2 processes | 1 thread, OPENBLAS_CORETYPE unset | — | — | not eligible: failed: " +
				"exit status 132 |"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.coreType == "" {
				unsetCoreType(t)
			} else {
				t.Setenv(openBLASCoreType, tt.coreType)
			}
			dir := t.TempDir()
			log := filepath.Join(dir, "python.log")
			demo := fakeProgram(t, dir, "demo", filepath.Join(dir, "demo.log"),
				`echo '{"train_examples":512,"epochs":1,"examples_per_second":1500,"test_accuracy":0.8,"parameters":7}'`)
			p := quickPlan()
			require.NoError(t, p.only("e2e"))
			p.EndToEnd.Procs, p.Calibration.Rounds = []int{tt.procs}, tt.rounds
			d := &driver{plan: p, progress: &bytes.Buffer{}, benchstat: &bytes.Buffer{}, numCPU: 2,
				endToEnd: endToEndSetup{demo: demo, python: fakePyTorch(t, dir, log, tt.figures), dataDir: "/data"}}
			res := &results{Plan: p}
			require.NoError(t, d.checkPrograms(context.Background(), res, dir))
			var err error
			res.EndToEnd, err = d.measureEndToEnd(context.Background())
			require.NoError(t, err)

			data, err := os.ReadFile(log)
			require.NoError(t, err)
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			require.Len(t, lines, len(tt.calibration)+1, "the calibration's runs, then one round:\n%s", data)
			config := func(line string) string {
				core, _, _ := strings.Cut(line, " ")
				threads := strings.Fields(line[strings.Index(line, "--threads ")+len("--threads "):])[0]
				return threads + "/" + core
			}
			for i, want := range tt.calibration {
				assert.Equal(t, want, config(lines[i]), "calibration run %d", i)
				assert.Contains(t, lines[i], " --seed 42 --limit 256 ", "calibration run %d: the plan's seed, the calibration's examples", i)
			}
			assert.Equal(t, tt.measured, config(lines[len(lines)-1]), "the round runs the chosen configuration")

			var torch *endToEndResult
			for i, r := range res.EndToEnd {
				if r.Impl == implPyTorch {
					torch = &res.EndToEnd[i]
				}
			}
			require.NotNil(t, torch)
			require.NotNil(t, torch.PyTorch)
			assert.Equal(t, tt.chosen, torch.PyTorch.Chosen)
			assert.Equal(t, tt.coreType, torch.PyTorch.CoreType)
			md := report(res)
			if tt.goal != "" {
				assert.Contains(t, md, "| End to end: MLP throughput, 1 process | goaccel ≥ 1.5× PyTorch's examples/s "+tt.goal)
			}
			for _, want := range tt.page {
				assert.Contains(t, md, want)
			}
		})
	}
}

// TestPyTorchCalibrationFailure: a candidate with the environment's OPENBLAS_CORETYPE that fails stops the
// section, as any failed run does.
func TestPyTorchCalibrationFailure(t *testing.T) {
	unsetCoreType(t)
	dir := t.TempDir()
	p := quickPlan()
	require.NoError(t, p.only("e2e"))
	p.EndToEnd.Procs = []int{1}
	d := &driver{plan: p, progress: &bytes.Buffer{}, benchstat: &bytes.Buffer{}, numCPU: 2,
		endToEnd: endToEndSetup{demo: fakeProgram(t, dir, "demo", filepath.Join(dir, "log"), "exit 0"),
			python: fakePyTorch(t, dir, filepath.Join(dir, "python.log"), map[string]string{"2/unset": "1000 0.8", "1/unset": "fail"}),
			script: "fashion_ddp.py"}}
	_, err := d.measureEndToEnd(context.Background())
	assert.ErrorContains(t, err, "mlp with pytorch on 1 process: calibrating PyTorch with 1 thread: ")
}

// TestCalibrationJobs: a calibration run trains at most the calibration's examples or steps.
func TestCalibrationJobs(t *testing.T) {
	full := fullPlan()
	assert.Equal(t, 8192, full.EndToEnd.calibrationJob(full.Calibration).Limit, "all 60000 examples: the calibration's")
	assert.Equal(t, 8192, full.ResNet.calibrationJob(full.Calibration).Limit)
	job := full.Transformer.calibrationJob(full.Calibration)
	assert.Equal(t, 30, job.Steps)
	assert.Equal(t, 10, job.Warmup)
	quick := quickPlan()
	assert.Equal(t, 256, quick.EndToEnd.calibrationJob(quick.Calibration).Limit, "the calibration's 256 of the plan's 512")
	job = quick.Transformer.calibrationJob(calibrationPlan{Steps: 2})
	assert.Equal(t, 2, job.Steps)
	assert.Equal(t, 1, job.Warmup)
	assert.Equal(t, 100, fullPlan().EndToEnd.calibrationJob(calibrationPlan{Examples: 100}).Limit)
	assert.Equal(t, 50, shorter(50, 100))
	assert.Equal(t, 0, shorter(0, 0))
}
