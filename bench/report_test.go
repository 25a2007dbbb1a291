package bench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// constant is a series whose every sample takes sec seconds.
func constant(name string, sec float64) series {
	return series{Name: name, Iters: 1, Seconds: []float64{sec, sec, sec}}
}

// withCalls is a constant series carrying all-reduce counts per step.
func withCalls(name string, sec, calls float64) series {
	s := constant(name, sec)
	s.Extra = map[string]float64{callsUnit: calls, bytesUnit: calls * (1 << 20)}
	return s
}

// syntheticResults has goals met and missed in every section, so the report's judgements show.
func syntheticResults() *results {
	p := fullPlan()
	p.Ranks = []int{2}
	res := &results{Plan: p, Machine: machine{CPU: "Test CPU", Cores: 2, LoadBefore: "0.10 0.20 0.30", PyTorch: "1.13"}}
	res.AllReduce = []allReduceResult{
		{Ranks: 2, Bytes: 64 << 10, Raw: constant("r", 1), Goaccel: constant("g", 2), Iallreduce: constant("i", 1)},   // below 1 MB: not judged
		{Ranks: 2, Bytes: 1 << 20, Raw: constant("r", 1), Goaccel: constant("g", 1.02), Iallreduce: constant("i", 1)}, // 0.98: met
		{Ranks: 2, Bytes: 4 << 20, Raw: constant("r", 1), Goaccel: constant("g", 1.25), Iallreduce: constant("i", 1)}, // 0.80: missed
	}
	res.Sync = []syncResult{{Ranks: 2, Model: "m", Tensors: 3, Bytes: 1 << 20,
		Flat: constant("f", 1), PerTensor: constant("p", 5), PerTensorAsync: constant("pa", 2),
		Caps: []capResult{
			{CapBytes: 1 << 20, BucketBytes: []int64{1, 2, 3}, Pipelined: constant("b1", 0.9), Sequential: constant("s1", 2)},
			{CapBytes: defaultBucketCapBytes, BucketBytes: []int64{6}, Pipelined: constant("b", 1.1), Sequential: constant("s", 1.1)},
			{CapBytes: 100 << 20, BucketBytes: []int64{6}, Pipelined: constant("b", 1.1), Sequential: constant("s", 1.1)},
		}}}
	// bag-of-words: 1.2× (goal missed); MLP: 2× (one sync costs 1/3 s, a micro-batch's computation 1/6 s).
	res.Accumulation = []accumulationResult{
		{Ranks: 2, Config: bagOfWords(), Accumulate: withCalls("a", 1, 2), SyncEveryMicroBatch: withCalls("e", 1.2, 8),
			SyncEachBatch: withCalls("s", 2, 8)},
		{Ranks: 2, Config: demoMLP(), Accumulate: withCalls("a", 1, 2), SyncEveryMicroBatch: withCalls("e", 2, 8),
			SyncEachBatch: withCalls("s", 2, 8)},
	}
	res.Overhead = []overheadResult{{Config: bagOfWords(), Goaccel: constant("ga", 1.01), GoMLX: constant("gm", 1)}}
	res.Compute = []computeResult{
		{Config: computeConfigs[0], Steps: constant("c0", 3), PeakRSS: 1600 << 20},
		{Config: computeConfigs[1], Steps: constant("c1", 0.4), PeakRSS: 40 << 20},
		{Config: computeConfigs[2], Err: "compute: GOACCEL_MATMUL=blas needs a build with -tags blas\nmore"},
	}
	perExample := func(examplesPerSecond float64) series { return constant("e", 1/examplesPerSecond) }
	res.EndToEnd = []endToEndResult{
		{Impl: "goaccel", Model: "mlp", Procs: 1, PerExample: perExample(30000), TestAccuracy: []float64{0.85}},
		{Impl: "goaccel", Model: "mlp", Procs: 2, PerExample: perExample(40000), TestAccuracy: []float64{0.84}},
		{Impl: "pytorch", Model: "mlp", Procs: 1, PerExample: perExample(25000), TestAccuracy: []float64{0.86}},
		{Impl: "pytorch", Model: "mlp", Procs: 2, PerExample: perExample(50000), TestAccuracy: []float64{0.85}},
		{Impl: "goaccel", Model: "cnn", Procs: 1, PerExample: perExample(900), TestAccuracy: []float64{0.91, 0.90, 0.92}},
		{Impl: "pytorch", Model: "cnn", Procs: 1, PerExample: perExample(1000), TestAccuracy: []float64{0.90}},
	}
	return res
}

func TestReportJudgesGoals(t *testing.T) {
	md := report(syntheticResults())
	summary := md[strings.Index(md, "## Summary"):strings.Index(md, "## End to end")]
	for _, want := range []string{
		"| 1 process: 1.20×; 2 processes: 0.80× | no |",            // goaccel / PyTorch examples/s
		"| 1 process: 0.9100 vs 0.9000 | **yes** |",                // median CNN accuracies, goaccel vs PyTorch
		"| pure Go: 40 MB | **yes** |",                             // BLAS not measured: not judged
		"| 7.5× | **yes** |",                                       // 3 s / 0.4 s
		"| worst 0.80 (4MB, 2 ranks) | no |",                       // one size misses
		"| 2 ranks: 4.5× (async per tensor: 1.8×) | **yes** |",     // 5 s / 1.1 s
		"| 2 ranks: 1.10× | **yes** |",                             // 1.1 s / 1 s ≤ 1.15
		"| 2 ranks: 1.20× | no |",                                  // bag-of-words only, below 1.3
		"| bow, 2 ranks: 2 vs 8; mlp, 2 ranks: 2 vs 8 | **yes** |", // exactly K times
		"| bag-of-words 65536×32, 32→64→10: 1.010× | **yes** |",
	} {
		assert.Contains(t, summary, want)
	}
	for _, want := range []string{
		"| 2 | 40000 ±0% | 50000 ±0% | 0.80× | 0.8400 | 0.8500 | 3 |",
		"From 1 to 2 processes goaccel's throughput changes 1.33×, PyTorch's 2.00×.",
		"| BLAS | `GOACCEL_GRADIENTS=gemm GOACCEL_MATMUL=blas` | not measured: compute: GOACCEL_MATMUL=blas needs a build with -tags blas |",
		"makes a step 7.5× faster and its peak memory 40.0× smaller (40 MB instead of 1600 MB)",
		"MPI_Iallreduce reaches 1.00 of MPI_Allreduce's bandwidth: MPI's non-blocking algorithm is not what limits goaccel",
		"the fastest cap (section 5 sweeps them) is 1MB",
		"| 2 | 1MB | 3 | 900.00 ms ±0% **best** | 2.00 s ±0% | 2.22× |",
		"The 25MB and 100MB caps make the same plan",
		"one sync of 2.0 MB costs 333.33 ms, 200% of a micro-batch's computation (166.67 ms)",
		"goaccel − GoMLX = 10.00 ms per optimizer step (+1.0%), 2.50 ms per micro-batch",
		"[benchmarks-method.md](benchmarks-method.md#3-accumulation)",
	} {
		assert.Contains(t, md, want)
	}
	for _, unwanted := range []string{"Smoke test", "was not idle", "DESIGN", "§"} {
		assert.NotContains(t, md, unwanted)
	}
}

func TestReportNotes(t *testing.T) {
	tests := []struct {
		name   string
		change func(*results)
		want   string
	}{
		{"quick run", func(r *results) { r.Plan.Quick = true }, "Smoke test"},
		{"busy machine", func(r *results) { r.Machine.LoadBefore = "3.50 2.00 1.00" }, "a load average of 3.5 on 2 cores"},
		{"limited examples", func(r *results) { r.Plan.EndToEnd.Limit = 512 }, "first 512 training examples only"},
		{"different models", func(r *results) { r.EndToEnd[0].Parameters, r.EndToEnd[2].Parameters = 101770, 1 },
			"**The models differ:** goaccel's has 101770 parameters, PyTorch's 1."},
		{"same models", func(r *results) { r.EndToEnd[0].Parameters, r.EndToEnd[2].Parameters = 101770, 101770 },
			"Both models have 101770 parameters."},
		{"compute without the demo's job", func(r *results) { r.EndToEnd = nil },
			"## End to end against PyTorch\n\n### Big MLP"},
		{"nothing measured", func(r *results) { *r = results{Plan: r.Plan} }, "| End to end: MLP throughput | goaccel ≥ 1.0× PyTorch DDP's examples/s, 1 and 2 processes | — | — |"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := syntheticResults()
			tt.change(res)
			assert.Contains(t, report(res), tt.want)
		})
	}
}
