package bench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// constant is a series whose every sample takes sec seconds.
func constant(name string, sec float64) Series {
	return Series{Name: name, Iters: 1, Seconds: []float64{sec, sec, sec}}
}

// syntheticResults has one goal met and one missed in every section, so the report's judgements show.
func syntheticResults() *Results {
	plan := FullPlan()
	plan.Ranks = []int{2}
	res := &Results{Plan: plan, Machine: Machine{CPU: "Test CPU", Cores: 2, LoadBefore: "0.10 0.20 0.30"}}
	res.Shipped.AllReduce = []AllReduceResult{
		{Ranks: 2, Bytes: 64 << 10, Raw: constant("r", 1), Goaccel: constant("g", 2)},   // below 1 MB: not judged
		{Ranks: 2, Bytes: 1 << 20, Raw: constant("r", 1), Goaccel: constant("g", 1.02)}, // 0.98: met
		{Ranks: 2, Bytes: 4 << 20, Raw: constant("r", 1), Goaccel: constant("g", 1.25)}, // 0.80: missed
	}
	res.Shipped.Sync = []SyncResult{{Ranks: 2, Model: "m", Tensors: 3, Bytes: 1 << 20,
		Flat: constant("f", 1), PerTensor: constant("p", 5), PerTensorAsync: constant("pa", 2),
		Caps: []CapResult{
			{CapBytes: 1 << 20, Buckets: 3, BucketBytes: []int64{1, 2, 3}, Pipelined: constant("b1", 0.9),
				Sequential: constant("s1", 2)},
			{CapBytes: DefaultBucketCapBytes, Buckets: 1, BucketBytes: []int64{6}, Pipelined: constant("b", 1.1),
				Sequential: constant("s", 1.1)},
			{CapBytes: 100 << 20, Buckets: 1, BucketBytes: []int64{6}, Pipelined: constant("b", 1.1),
				Sequential: constant("s", 1.1)},
		}}}
	acc := constant("acc", 1)
	res.Shipped.Accumulation = []AccumulationResult{{Ranks: 2, Config: bagOfWords(), Accumulate: acc,
		SyncEveryMicroBatch: constant("every", 1.2), SyncEachBatch: constant("each", 2),
		Calls: map[string]float64{"acc": 2, "every": 8, "each": 8}, Bytes: map[string]float64{}}}
	res.Overhead = []OverheadResult{{Config: bagOfWords(), Goaccel: constant("ga", 1.01), GoMLX: constant("gm", 1)}}
	return res
}

func TestReportJudgesGoals(t *testing.T) {
	md := Report(syntheticResults())
	summary := md[strings.Index(md, "## Summary"):strings.Index(md, "## 1.")]
	for _, want := range []string{
		"| worst 0.80 (4MB, 2 ranks) | no |",                    // 1: one size misses
		"| 2 ranks: 4.5× (async per tensor: 1.8×) | **yes** |",  // 2: 5 s / 1.1 s
		"| 2 ranks: 1.10× | **yes** |",                          // 2: 1.1 s / 1 s ≤ 1.15
		"| 2 ranks: 1.20× | no |",                               // 3: below 1.3
		"| 2 ranks: 2 vs 8 | **yes** |",                         // 3: exactly K=4 times
		"| bag-of-words 65536×32, 32→64→10: 1.010× | **yes** |", // 4
	} {
		assert.Contains(t, summary, want)
	}
	assert.Contains(t, md, "| 1MB | 1.00 s ±0% |", "medians with their spread")
	assert.Contains(t, md, "the fastest cap is 1MB", "the cap sweep names the best cap")
	assert.Contains(t, md, "The 25MB and 100MB caps lead to the same plan")
	assert.NotContains(t, md, "The 1MB and 25MB caps")
	assert.NotContains(t, md, "Smoke test")
	assert.NotContains(t, md, "was not idle", "a load of 0.1 on 2 cores is idle")
	assert.NotContains(t, md, "What-if", "no what-if run, no column")
}

func TestReportShowsTheFixes(t *testing.T) {
	res := syntheticResults()
	fixed := res.Shipped
	fixed.AllReduce = []AllReduceResult{{Ranks: 2, Bytes: 4 << 20, Raw: constant("r", 1), Goaccel: constant("g", 1)}}
	res.WithFixes = &fixed
	md := Report(res)
	assert.Contains(t, md, "| worst 0.80 (4MB, 2 ranks) | no | worst 1.00 (4MB, 2 ranks) | **yes** |")
	assert.Contains(t, md, "**2 ranks, what-if**")
}

func TestReportWarnsAboutLoadAndQuickRuns(t *testing.T) {
	res := syntheticResults()
	res.Plan.Quick = true
	res.Machine.LoadBefore = "3.50 2.00 1.00"
	md := Report(res)
	assert.Contains(t, md, "Smoke test")
	assert.Contains(t, md, "a load average of 3.5 on 2 cores")
}
