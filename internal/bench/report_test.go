package bench

import (
	"strings"
	"testing"
	"time"

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
	p.Network = twoModelNetwork()
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
	perToken := func(tokensPerSecond float64) series { return constant("t", 1/tokensPerSecond) }
	// 1 process: 1.10× and +1.0% (both met); 2 processes: 0.50× and −3.0% (both missed).
	res.Transformer = []transformerResult{
		{Impl: "goaccel", Procs: 1, PerToken: perToken(11000), ValidationLoss: []float64{2.02}, Steps: 100, Parameters: 471296},
		{Impl: "goaccel", Procs: 2, PerToken: perToken(10000), ValidationLoss: []float64{1.94}, Steps: 100, Parameters: 471296},
		{Impl: "pytorch", Procs: 1, PerToken: perToken(10000), ValidationLoss: []float64{2.0}, Steps: 100, Parameters: 471296},
		{Impl: "pytorch", Procs: 2, PerToken: perToken(20000), ValidationLoss: []float64{2.0}, Steps: 100, Parameters: 471296},
	}
	// PyTorch's 1-process row chose 1 thread without OPENBLAS_CORETYPE; on 2 threads, without it the loss was wrong.
	calibrated := func(threads int, unset bool, tokensPerSecond, loss float64) torchCandidate {
		return torchCandidate{Config: torchConfig{Threads: threads, UnsetCoreType: unset}, PerUnit: perToken(tokensPerSecond),
			Quality: []float64{loss}}
	}
	cands := []torchCandidate{calibrated(2, false, 8000, 2.1), calibrated(2, true, 9000, 2.5), calibrated(1, false, 9500, 2.1),
		calibrated(1, true, 10500, 2.11)}
	chooseTorch(cands, transformerCheck)
	res.Transformer[2].PyTorch = &torchChoice{CoreType: "Haswell", Check: transformerCheck, Rounds: 3, Cands: cands,
		Chosen: torchConfig{Threads: 1, UnsetCoreType: true}}
	res.Transformer[3].PyTorch = &torchChoice{CoreType: "Haswell", Check: transformerCheck, Only: true, Chosen: torchConfig{Threads: 1}}
	// 1 process: 1.05× and 0.8810 vs 0.8900 (both met); 2 processes: 0.80× and 0.8600 vs 0.8750 (both missed).
	res.ResNet = []endToEndResult{
		{Impl: "goaccel", Model: "resnet", Procs: 1, PerExample: perExample(2100), TestAccuracy: []float64{0.8810, 0.88, 0.89}, Parameters: 19706},
		{Impl: "goaccel", Model: "resnet", Procs: 2, PerExample: perExample(3200), TestAccuracy: []float64{0.86}, Parameters: 19706},
		{Impl: "goaccel-purego", Model: "resnet", Procs: 1, PerExample: perExample(1000), TestAccuracy: []float64{0.8811}, Parameters: 19706},
		{Impl: "pytorch", Model: "resnet", Procs: 1, PerExample: perExample(2000), TestAccuracy: []float64{0.89}, Parameters: 19706},
		{Impl: "pytorch", Model: "resnet", Procs: 2, PerExample: perExample(4000), TestAccuracy: []float64{0.875}, Parameters: 19706},
	}
	res.LSTM = []lstmResult{
		{Impl: "goaccel", PerExample: perExample(5000), FinalLoss: []float64{0.0002, 0.0004, 0.0003}, Parameters: 4513},
		{Impl: "pytorch", PerExample: perExample(17500), FinalLoss: []float64{0.0003}, Parameters: 4513,
			PyTorch: &torchChoice{Check: lstmCheck, Rounds: 3, Chosen: torchConfig{Threads: 1}, Cands: []torchCandidate{
				{Config: torchConfig{Threads: 2}, PerUnit: perExample(16000), Quality: []float64{0.0003}, Eligible: true},
				{Config: torchConfig{Threads: 1}, PerUnit: perExample(17000), Quality: []float64{0.0003}, Eligible: true}}}},
	}
	// 3.5× faster with the convolution executor.
	res.PureGoCNN = []pureGoResult{
		{Variant: pureGoVariant{Release: pureGoBaseline}, PerExample: perExample(100), TestAccuracy: []float64{0.71}},
		{Variant: pureGoVariant{Conv: "graph"}, PerExample: perExample(200), TestAccuracy: []float64{0.71}},
		{Variant: pureGoVariant{Conv: "kernel"}, PerExample: perExample(350), TestAccuracy: []float64{0.72}},
	}
	res.Demo = &demoResult{Args: []string{"-model", "cnn"}, Wall: constant("d", 75), TrainSeconds: []float64{60},
		TestAccuracy: []float64{0.905}}
	res.Network = syntheticNetwork()
	return res
}

// twoModelNetwork is section 6 as it was planned before its modes and cluster sizes: two models, K = 4
// and 1, plain training on 2 hosts. Its tables and goals keep rendering.
func twoModelNetwork() networkPlan {
	models := []networkModel{{Name: "mlp", Hidden: 1024, Limit: 24576}, {Name: "cnn", Hidden: 128, Limit: 12288}}
	p := networkPlan{Rates: []int64{0, 10_000_000_000, 1_000_000_000}, Hosts: 2, Models: models, Ks: []int{4, 1},
		Batch: 64, Epochs: 1, LR: 0.002, Seed: 42, Rounds: 1,
		SyncTiming: timing{Samples: 9, SampleTime: 500 * time.Millisecond, MinIters: 1, MaxIters: 100},
		LinkCheck:  time.Second}
	p.Syncs = networkSyncs(models, deepMLP())
	return p
}

// syntheticNetwork is section 6 unthrottled and at 1 Gbit/s. The 1024-wide MLP's throughput misses its goal
// at 1 Gbit/s with K=1 (0.98×), the CNN's meets it; at 1 Gbit/s the MLP's sync is 1.05× the link's limit and
// 2.00× faster as bf16 (both met), the CNN's 1.13× and 1.63× (both missed).
func syntheticNetwork() []networkResult {
	timed := func(sec float64) series { s := constant("s", sec); s.Iters = 20; return s }
	run := func(impl, model string, k int, perSecond, step float64) networkRun {
		r := networkRun{Impl: impl, Model: model, K: k, PerExample: constant("e", 1/perSecond), TestAccuracy: []float64{0.8},
			StepSeconds: []float64{step}, Steps: []int64{100}}
		if impl == "goaccel" {
			r.MicroBatchSeconds, r.UpdateSeconds = []float64{0.003}, []float64{0.0005}
		}
		return r
	}
	mlp := func(bucketed, perTensor, bf16 float64) networkSyncResult {
		return networkSyncResult{Ranks: 2, Layout: "mlp-1024", Model: "MLP 784→1024→10", Tensors: 4, Bytes: 3_256_360,
			Buckets: 2, Bucketed: timed(bucketed), PerTensor: timed(perTensor), BucketedBF16: timed(bf16)}
	}
	cnn := func(bucketed, perTensor, bf16 float64) networkSyncResult {
		return networkSyncResult{Ranks: 2, Layout: "cnn-128", Model: "CNN (dense hidden layer of 128)", Tensors: 8,
			Bytes: 827_688, Buckets: 1, Bucketed: timed(bucketed), PerTensor: timed(perTensor), BucketedBF16: timed(bf16)}
	}
	return []networkResult{
		{RateBits: 0, Emulated: true, Hosts: "h0:1, h1:1", LinkBits: 14e9,
			Sync: []networkSyncResult{mlp(0.003, 0.0033, 0.0035), cnn(0.0008, 0.0011, 0.0009)},
			Runs: []networkRun{run("goaccel", "mlp-1024", 4, 19000, 0.027), run("pytorch", "mlp-1024", 4, 17000, 0.03),
				run("goaccel", "mlp-1024", 1, 12000, 0.0105), run("pytorch", "mlp-1024", 1, 8000, 0.016),
				run("goaccel", "cnn-128", 4, 10000, 0.05), run("pytorch", "cnn-128", 4, 5000, 0.1)}},
		{RateBits: 1e9, BurstBytes: 1_000_000, Emulated: true, Hosts: "h0:1, h1:1", LinkBits: 0.956e9,
			Sync: []networkSyncResult{mlp(0.0274, 0.0275, 0.0137), cnn(0.0075, 0.0076, 0.0046)},
			Runs: []networkRun{run("goaccel", "mlp-1024", 4, 12800, 0.04), run("pytorch", "mlp-1024", 4, 11200, 0.045),
				run("goaccel", "mlp-1024", 1, 4400, 0.029), run("pytorch", "mlp-1024", 1, 4500, 0.028),
				run("goaccel", "cnn-128", 4, 9000, 0.057), run("pytorch", "cnn-128", 4, 5000, 0.1)}},
	}
}

func TestReportJudgesGoals(t *testing.T) {
	md := report(syntheticResults())
	summary := md[strings.Index(md, "## Summary"):strings.Index(md, "## End to end")]
	for _, want := range []string{
		// A ratio short of its goal says by how much goaccel would have to speed up.
		"| End to end: MLP throughput, 1 process | goaccel ≥ 1.5× PyTorch's examples/s | 1.20× (25% short) | no |",
		"| End to end: MLP throughput, 2 processes | goaccel ≥ 1.2× PyTorch DDP's examples/s | 2 processes: 0.80× (50% short) | no |",
		"| End to end: CNN throughput | goaccel ≥ 1.5× PyTorch DDP's examples/s, 1 and 2 processes | 1 process: 0.90× (67% short) | no |",
		"| goaccel ≥ 1.2× PyTorch DDP's tokens/s, 1 and 2 processes | 1 process: 1.10× (9% short); 2 processes: 0.50× (140% short) | no |",
		"| 1 process: 2.0200 vs 2.0000 (+1.0%); 2 processes: 1.9400 vs 2.0000 (−3.0%) | no |",
		"| End to end: ResNet throughput | goaccel ≥ 1.0× PyTorch DDP's examples/s, 1 and 2 processes | 1 process: 1.05×; 2 processes: 0.80× (25% short) | no |",
		"| End to end: ResNet accuracy | after the same epochs, goaccel's test accuracy within 0.01 of PyTorch's, medians " +
			"over seeds | 1 process: 0.8810 vs 0.8900; 2 processes: 0.8600 vs 0.8750 | no |",
		"≤ 90 s | 1 min 15 s | **yes** |",
		"goaccel 0.2.0 (pure Go both) | 3.50× | **yes** |",
		"| 1 process: 0.9100 vs 0.9000 | **yes** |",                // median CNN accuracies, goaccel vs PyTorch
		"| pure Go: 40 MB | **yes** |",                             // BLAS not measured: not judged
		"| 7.5× | **yes** |",                                       // 3 s / 0.4 s
		"| worst 0.80 (4MB, 2 ranks) | no |",                       // one size misses
		"| 2 ranks: 4.5× (async per tensor: 1.8×) | **yes** |",     // 5 s / 1.1 s
		"| 2 ranks: 1.10× | **yes** |",                             // 1.1 s / 1 s ≤ 1.15
		"| 2 ranks: 1.20× | no |",                                  // bag-of-words only, below 1.3
		"| bow, 2 ranks: 2 vs 8; mlp, 2 ranks: 2 vs 8 | **yes** |", // exactly K times
		"| bag-of-words 65536×32, 32→64→10: 1.010× | **yes** |",
		"| 6. Network: MLP 784→1024→10 throughput | goaccel ≥ 1.0× PyTorch DDP's examples/s across the hosts, at every " +
			"rate and K | unthrottled, K=4: 1.12×; unthrottled, K=1: 1.50×; 1 Gbit/s, K=4: 1.14×; 1 Gbit/s, K=1: 0.98× | no |",
		"| 6. Network: CNN (dense hidden layer of 128) throughput | goaccel ≥ 1.0× PyTorch DDP's examples/s across the " +
			"hosts, at every rate and K | unthrottled, K=4: 2.00×; 1 Gbit/s, K=4: 1.80× | **yes** |",
		"| 6. Network: sync against the link | bucketed sync ≤ 1.1 × the link's limit 2(N−1)/N·S/B at 1 Gbit/s | " +
			"MLP 784→1024→10: 1.05×; CNN (dense hidden layer of 128): 1.13× | no |",
		"| 6. Network: bf16 compression | bucketed sync ≥ 1.7× faster sent as bf16, at 1 Gbit/s | " +
			"MLP 784→1024→10: 2.00×; CNN (dense hidden layer of 128): 1.63× | no |",
	} {
		assert.Contains(t, summary, want)
	}
	for _, want := range []string{
		"| 2 | 40000 ±0% | 50000 ±0% | 0.80× | 0.8400 | 0.8500 | 3 |",
		"### The transformer language model",
		"| 1 | 11000 ±0% | 10000 ±0% | 1.10× | 2.0200 | 2.0000 | +1.0% | 3 |",
		"| 2 | 10000 ±0% | 20000 ±0% | 0.50× | 1.9400 | 2.0000 | −3.0% | 3 |",
		"Both models have 471296 parameters.",
		"each with `OPENBLAS_CORETYPE=Haswell` as the environment sets it (goaccel runs with it) and without it. A " +
			"candidate without it is eligible only when its validation loss is within 2% of that of the run with it on " +
			"the same threads. Before the rounds above, each candidate trained 3 time(s) on a shorter job (30 optimizer " +
			"steps), interleaved, and the fastest eligible one (median) ran the row: goals are judged against it.",
		"| 1 process | 2 threads | 8000 ±0% | 2.1000 |  |",
		"| 1 process | 2 threads, OPENBLAS_CORETYPE unset | 9000 ±0% | 2.5000 | not eligible: validation loss 2.5000 " +
			"against 2.1000 with OPENBLAS_CORETYPE |",
		"| 1 process | 1 thread, OPENBLAS_CORETYPE unset | 10500 ±0% | 2.1100 | **chosen** |",
		"| 2 processes | 1 thread | — | — | **chosen** (the only candidate) |",
		"(2 blocks, d_model 128, 4 heads, context 64)",
		"### The ResNet",
		"### The LSTM",
		"[benchmarks-method.md](benchmarks-method.md#the-lstm)",
		"an LSTM of 32 units (GoMLX's `layers/lstm`; `torch.nn.LSTM` in the twin) reads 16 samples",
		"| 1 | 5000 ±0% | 17500 ±0% | 0.29× | 0.000300 | 0.000300 | 3 |",
		"Both models have 4513 parameters. Final losses by round (seed): goaccel 0.000200, 0.000400, 0.000300, PyTorch 0.000300.",
		"`OPENBLAS_CORETYPE` is not set in the environment, so there is no run without it to compare. Before the rounds " +
			"above, each candidate trained 3 time(s) on a shorter job (2048 sequences, 10 epochs), interleaved, and the " +
			"fastest eligible one (median) ran the row.\n",
		"| 1 process | 2 threads | 16000 ±0% | 0.000300 |  |",
		"| 1 process | 1 thread | 17000 ±0% | 0.000300 | **chosen** |",
		"[benchmarks-method.md](benchmarks-method.md#the-resnet)",
		"| 1 | 2100 ±0% | 1000 ±0% | 2000 ±0% | 1.05× | 0.50× | 0.8810 | 0.8811 | 0.8900 | 3 |",
		"| 2 | 3200 ±0% | — | 4000 ±0% | 0.80× | — | 0.8600 | — | 0.8750 | 3 |",
		"From 1 to 2 processes goaccel's throughput changes 1.52×, PyTorch's 2.00×. Test accuracies by round (seed): " +
			"1 process: goaccel 0.8810, 0.8800, 0.8900, PyTorch 0.8900; 2 processes: goaccel 0.8600, PyTorch 0.8750. " +
			"Both models have 19706 parameters.",
		"| goaccel 0.2.0 (built from its source) | 100 ±0% | 1.00× | 0.7100 | 3 |",
		"| `GOACCEL_CONV=graph` | 200 ±0% | 2.00× | 0.7100 | 3 |",
		"| `GOACCEL_CONV=kernel` | 350 ±0% | 3.50× | 0.7200 | 3 |",
		"`bin/grad_accum -model cnn` on one process",
		"| 1 min 15 s | 1 min 00 s | 0.9050 | 3 |",
		"[benchmarks-method.md](benchmarks-method.md#the-transformer-language-model)",
		"[benchmarks-method.md](benchmarks-method.md#the-demos-cnn-without-blas)",
		"[benchmarks-method.md](benchmarks-method.md#the-demos-wall-time)",
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
		"## 6. On a network",
		"[benchmarks-method.md](benchmarks-method.md#6-on-a-network)",
		"| unthrottled | — | 14 Gbit/s | — |",
		"| 1 Gbit/s | 1.00 MB | 956 Mbit/s | 0.96 |",
		"MLP 784→1024→10, 24576 training examples, 3.26 MB per sync:",
		"| 1 Gbit/s | 1 | 4400 ±0% | 4500 ±0% | 0.98× | 0.8000 | 0.8000 |",
		"| 1 Gbit/s | MLP 784→1024→10, 3.26 MB | 26.05 ms | 27.40 ms ±0% (2) | 27.50 ms ±0% (4) | 13.70 ms ±0% | 1.05× | 1.00× | 2.00× |",
		"| unthrottled | CNN (dense hidden layer of 128), 0.83 MB | — | 800.0 µs ±0% (1) | 1.10 ms ±0% (8) | 900.0 µs ±0% | — | 1.38× | 0.89× |",
		"A throttled link banks the tokens of the time it is idle, up to its bucket: 1.00 MB at 1 Gbit/s (8.00 ms of the rate).",
		"The token bucket holds a whole sync of 0.83 MB at 1 Gbit/s. Timed back to back, only the first sync of a " +
			"sample can start on a full bucket, which shortens any median above by at most 5.0%.",
		"| 1 Gbit/s | MLP 784→1024→10 | 1 | 3.00 ms | 27.40 ms | 29.00 ms | 25.50 ms | 3.00 ms (10%) |",
		"| 1 Gbit/s | CNN (dense hidden layer of 128) | 4 | 3.00 ms | 7.50 ms | 57.00 ms | 44.50 ms | 3.00 ms (5%) |",
		"With K=1, overlap could save at most 3.00 ms of a 10.50 ms step for the MLP 784→1024→10 unthrottled and " +
			"3.00 ms of a 29.00 ms step for the MLP 784→1024→10 at 1 Gbit/s.",
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
		{"compute without the demo's job", func(r *results) {
			r.EndToEnd, r.Transformer, r.ResNet, r.LSTM, r.PureGoCNN, r.Demo = nil, nil, nil, nil, nil, nil
		},
			"## End to end against PyTorch\n\n### Big MLP"},
		{"nothing measured", func(r *results) { *r = results{Plan: r.Plan} }, "| End to end: MLP throughput, 1 process | goaccel ≥ 1.5× PyTorch's examples/s | — | — |"},
		{"transformer models differ", func(r *results) { r.Transformer[2].Parameters = 5 },
			"**The models differ:** goaccel's has 471296 parameters, PyTorch's 5."},
		{"only the transformer", func(r *results) { *r = results{Plan: r.Plan, Transformer: r.Transformer} },
			"## End to end against PyTorch\n\n### The transformer language model"},
		{"only the ResNet", func(r *results) { *r = results{Plan: r.Plan, ResNet: r.ResNet} },
			"## End to end against PyTorch\n\n### The ResNet"},
		{"only the LSTM", func(r *results) { *r = results{Plan: r.Plan, LSTM: r.LSTM} },
			"## End to end against PyTorch\n\n### The LSTM"},
		{"LSTM models differ", func(r *results) { r.LSTM[1].Parameters = 9 },
			"**The models differ:** goaccel's has 4513 parameters, PyTorch's 9."},
		{"ResNet on fewer examples", func(r *results) { r.Plan.ResNet.Limit = 6000 }, "first 6000 training examples only"},
		{"ResNet models differ", func(r *results) { r.ResNet[3].Parameters = 7 },
			"**The models differ:** goaccel's has 19706 parameters, PyTorch's 7."},
		{"network not measured", func(r *results) { r.Network, r.NetworkSkipped = nil, "no root" },
			"> Section 6 (on a network) was not measured: no root."},
		{"machine-bound link", func(r *results) { r.Network[1].LinkBits = 0.5e9 },
			"At 1 Gbit/s the link carried less than 90% of the rate: this machine's copying between namespaces, not the " +
				"limiter, bounds it there"},
		{"the hosts' network", func(r *results) {
			r.Network = r.Network[:1]
			r.Network[0].Emulated, r.Network[0].LinkBits = false, 0
		}, "| the hosts' network | 1 | 12000 ±0% | 8000 ±0% | 1.50× |"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := syntheticResults()
			tt.change(res)
			assert.Contains(t, report(res), tt.want)
		})
	}
}

// TestGoalThresholds: each goal of the summary is met exactly up to its threshold and missed past it.
func TestGoalThresholds(t *testing.T) {
	rate := func(perSecond float64) series { return constant("x", 1/perSecond) }
	tests := []struct {
		name   string
		change func(*results)
		goal   string
		met    bool
	}{
		{"MLP 1 process at 1.5×", func(r *results) { r.EndToEnd[0].PerExample = rate(37500) }, "End to end: MLP throughput, 1 process", true},
		{"MLP 1 process at 1.4×", func(r *results) { r.EndToEnd[0].PerExample = rate(35000) }, "End to end: MLP throughput, 1 process", false},
		{"MLP 2 processes at 1.2×", func(r *results) { r.EndToEnd[1].PerExample = rate(60000) }, "End to end: MLP throughput, 2 processes", true},
		{"MLP 2 processes at 1.1×", func(r *results) { r.EndToEnd[1].PerExample = rate(55000) }, "End to end: MLP throughput, 2 processes", false},
		{"CNN at 1.5×", func(r *results) { r.EndToEnd[4].PerExample = rate(1500) }, "End to end: CNN throughput", true},
		{"CNN at 1.49×", func(r *results) { r.EndToEnd[4].PerExample = rate(1490) }, "End to end: CNN throughput", false},
		{"CNN accuracy 0.01 below", func(r *results) { r.EndToEnd[4].TestAccuracy = []float64{0.8905} }, "End to end: CNN accuracy", true},
		{"CNN accuracy 0.015 below", func(r *results) { r.EndToEnd[4].TestAccuracy = []float64{0.885} }, "End to end: CNN accuracy", false},
		{"transformer both at 1.2×", func(r *results) {
			r.Transformer[0].PerToken = rate(12000)
			r.Transformer[1].PerToken = rate(24000)
		}, "End to end: transformer throughput", true},
		{"transformer at 1.2× and 1.19×", func(r *results) {
			r.Transformer[0].PerToken = rate(12000)
			r.Transformer[1].PerToken = rate(23800)
		}, "End to end: transformer throughput", false},
		{"loss 1.9% lower", func(r *results) { r.Transformer[1].ValidationLoss = []float64{1.962} }, "End to end: transformer validation loss", true},
		{"loss 2.5% higher", func(r *results) {
			r.Transformer[1].ValidationLoss = []float64{2.0}
			r.Transformer[0].ValidationLoss = []float64{2.05}
		}, "End to end: transformer validation loss", false},
		{"ResNet both at 1.0×", func(r *results) { r.ResNet[1].PerExample = rate(4000) }, "End to end: ResNet throughput", true},
		{"ResNet accuracy 0.01 above and below", func(r *results) {
			r.ResNet[0].TestAccuracy, r.ResNet[1].TestAccuracy = []float64{0.90}, []float64{0.865}
		}, "End to end: ResNet accuracy", true},
		{"ResNet accuracy 0.0101 above", func(r *results) {
			r.ResNet[0].TestAccuracy, r.ResNet[1].TestAccuracy = []float64{0.9001}, []float64{0.875}
		}, "End to end: ResNet accuracy", false},
		{"demo 91 s", func(r *results) { r.Demo.Wall = constant("d", 91) }, "The demo's CNN, wall time", false},
		{"demo 90 s", func(r *results) { r.Demo.Wall = constant("d", 90) }, "The demo's CNN, wall time", true},
		{"pure Go 2.9×", func(r *results) { r.PureGoCNN[2].PerExample = rate(290) }, "The demo's CNN without BLAS", false},
		{"pure Go 3.0×", func(r *results) { r.PureGoCNN[2].PerExample = rate(300) }, "The demo's CNN without BLAS", true},
		{"network MLP at 1.0× at 1 Gbit/s", func(r *results) { r.Network[1].Runs[2].PerExample = rate(4500) },
			"6. Network: MLP 784→1024→10 throughput", true},
		{"network CNN at 0.99× unthrottled", func(r *results) { r.Network[0].Runs[4].PerExample = rate(4950) },
			"6. Network: CNN (dense hidden layer of 128) throughput", false},
		{"sync at 1.0999× the link's limit", func(r *results) { r.Network[1].Sync[1].Bucketed = constant("b", 1.0999*0.006621504) },
			"6. Network: sync against the link", true},
		{"sync at 1.101× the link's limit", func(r *results) { r.Network[1].Sync[1].Bucketed = constant("b", 1.101*0.006621504) },
			"6. Network: sync against the link", false},
		{"bf16 1.7×", func(r *results) { r.Network[1].Sync[1].BucketedBF16 = constant("c", 0.0075/1.7) },
			"6. Network: bf16 compression", true},
		{"a 10 Gbit/s rate is not judged", func(r *results) {
			r.Network[1].RateBits = 10e9
			r.Network = append(r.Network, syntheticNetwork()[1])
			r.Network[2].Sync[1].BucketedBF16 = constant("c", 0.0075/1.7)
		}, "6. Network: bf16 compression", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := syntheticResults()
			tt.change(res)
			var found *goal
			for _, g := range goals(res) {
				if g.what == tt.goal {
					found = g
				}
			}
			if assert.NotNil(t, found, tt.goal) {
				assert.True(t, found.known)
				assert.Equal(t, tt.met, found.met, "%s: %v", tt.goal, found.measured)
			}
		})
	}
}

// TestGoalsUnknownWithoutRuns: a section that did not run leaves its goals unjudged, never met.
func TestGoalsUnknownWithoutRuns(t *testing.T) {
	res := syntheticResults()
	res.Transformer, res.Demo = nil, nil
	res.ResNet = res.ResNet[2:4] // the pure-Go build and PyTorch: goals are judged on the BLAS build
	res.PureGoCNN = []pureGoResult{{Variant: pureGoVariant{Release: pureGoBaseline}}, {Variant: pureGoVariant{Conv: "kernel"}}}
	for _, g := range goals(res) {
		switch g.what {
		case "End to end: transformer throughput", "End to end: transformer validation loss",
			"End to end: ResNet throughput", "End to end: ResNet accuracy",
			"The demo's CNN, wall time", "The demo's CNN without BLAS":
			assert.False(t, g.known, g.what)
			assert.False(t, g.met, g.what)
		}
	}
}

// TestJudgeRatioSaysByHowMuch: a ratio short of its goal says by how much goaccel would have to speed up, with
// a decimal when it prints as the goal itself.
func TestJudgeRatioSaysByHowMuch(t *testing.T) {
	for _, tc := range []struct {
		q, target float64
		label     string
		measured  string
		met       bool
	}{
		{1.5, 1.5, "", "1.50×", true},
		{0.95, 1.2, "2 processes", "2 processes: 0.95× (26% short)", false},
		{1.196, 1.2, "", "1.20× (0.3% short)", false},
	} {
		g := &goal{}
		g.judgeRatio(tc.q, tc.target, tc.label)
		assert.Equal(t, []string{tc.measured}, g.measured)
		assert.Equal(t, tc.met, g.met)
	}
}
