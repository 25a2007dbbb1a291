package bench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syntheticSharding is the sharding section on 1, 2 and 4 processes for a model of 2^20 parameters
// (8 MB of Adam moments replicated) in 3 buckets. Every goal is met but the step time of `gradients` on 4
// processes (1.20×); `optimizer` on 2 processes holds 4 bytes of padding more than half, within the
// tolerance of one element per moment variable (6 of them: 24 bytes).
func syntheticSharding() []shardingResult {
	const mb = 1 << 20
	run := func(strategy string, procs int, state, peak int64, step float64) shardingResult {
		s := shardingResult{Strategy: strategy, Procs: procs, Params: 1 << 20, Buckets: 3, MomentVars: 6,
			Step: constant("s", step), Backward: constant("b", 0.4*step), Update: constant("u", 0.6*step),
			PerStep: shardingBreakdown{ReduceScatterWait: 0.01, AllGatherWait: 0.02, ModelCompute: 0.1, OptimizerCompute: 0.2}}
		if strategy == "replicated" {
			s.MomentVars = 10
		}
		for range procs {
			s.OptimizerState = append(s.OptimizerState, state)
			s.PeakRSS = append(s.PeakRSS, peak*mb)
			s.LiveHeap = append(s.LiveHeap, peak*mb/2)
		}
		return s
	}
	opt2 := run("optimizer", 2, 4*mb, 1100, 0.52)
	opt2.OptimizerState[0] += 4
	return []shardingResult{
		run("replicated", 1, 8*mb, 1200, 1.0),
		run("replicated", 2, 8*mb, 1300, 0.5), opt2, run("gradients", 2, 4*mb, 900, 0.54),
		run("replicated", 4, 8*mb, 1000, 1.0), run("optimizer", 4, 2*mb, 800, 1.05), run("gradients", 4, 2*mb, 600, 1.2),
	}
}

func shardingReport(t *testing.T, change func([]shardingResult)) (string, map[string]*goal) {
	t.Helper()
	res := &results{Plan: fullPlan(), Machine: machine{CPU: "Test CPU", Cores: 2, OpenBLASCore: "Haswell"},
		Sharding: syntheticSharding()}
	if change != nil {
		change(res.Sharding)
	}
	md := report(res)
	i := strings.Index(md, "## 7. Sharding (ZeRO)")
	require.GreaterOrEqual(t, i, 0, "no sharding section")
	byName := map[string]*goal{}
	for _, g := range shardingGoals(res) {
		byName[strings.TrimPrefix(g.what, "7. Sharding: ")] = g
	}
	return md[i:], byName
}

func TestReportSharding(t *testing.T) {
	section, _ := shardingReport(t, nil)
	for _, want := range []string{
		"MLP 784→4096→4096→4096→4096→10, 1.0 million float32 parameters (4 MB)",
		"Every configuration is a fresh mpirun job, run twice, the configurations interleaved,",
		"Machine: Test CPU, 2 cores, `OPENBLAS_CORETYPE` `Haswell`.",
		"| Strategy | Processes | Optimizer state per process (MB) | Peak RSS per process (MB) | Step (ms) | State / replicated | Peak / replicated | Step / replicated |",
		"| `replicated` | 1 | 8.0 | 1200 | 1000.0 ±0% | — | — | — |",
		"| `optimizer` | 2 | 4.0 | 1100 | 520.0 ±0% | 0.500× | 0.85× | 1.04× |",
		"| `gradients` | 4 | 2.0 | 600 | 1200.0 ±0% | 0.250× | 0.60× | 1.20× |",
		"| optimizer state | per process = 1/N of replicated's (± 1 element per bucket and moment) | optimizer, 2: 0.5000×; " +
			"gradients, 2: 0.5000×; optimizer, 4: 0.2500×; gradients, 4: 0.2500× | **yes** |",
		"| peak memory | `gradients` on 4 processes: peak RSS per process ≥ 35% below replicated's | −40.0% (600 MB vs 1000 MB) | **yes** |",
		"| step time | `optimizer` and `gradients` ≤ 1.1× replicated's step time, 2 and 4 processes | optimizer, 2: 1.04×; " +
			"gradients, 2: 1.08×; optimizer, 4: 1.05×; gradients, 4: 1.20× | no |",
		"| `gradients` | 2 | 216.0 ±0% | 324.0 ±0% | 100.0 | 200.0 | 0.0 | 10.0 | 20.0 | 450 / 900 |",
	} {
		assert.Contains(t, section, want)
	}
}

func TestShardingGoals(t *testing.T) {
	tests := []struct {
		name   string
		change func([]shardingResult)
		goal   string
		known  bool
		met    bool
	}{
		{"state within one element per moment", nil, "optimizer state", true, true},
		{"state 25 bytes off", func(s []shardingResult) { s[2].OptimizerState[1] += 25 }, "optimizer state", true, false},
		{"state not split", func(s []shardingResult) { s[6].OptimizerState[3] = 8 << 20 }, "optimizer state", true, false},
		{"peak 40% below", nil, "peak memory", true, true},
		{"peak 34% below", func(s []shardingResult) { s[6].PeakRSS[2] = 660 << 20 }, "peak memory", true, false},
		{"peak 35% below", func(s []shardingResult) { s[6].PeakRSS[2] = 650 << 20 }, "peak memory", true, true},
		{"step 1.20× on 4 processes", nil, "step time", true, false},
		{"step 1.10× everywhere", func(s []shardingResult) { s[6].Step = constant("s", 1.1) }, "step time", true, true},
		{"a failed configuration is not judged", func(s []shardingResult) { s[6].Err = "out of memory" }, "peak memory", false, false},
		{"no replicated reference", func(s []shardingResult) { s[4].Err, s[1].Err = "x", "x" }, "step time", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, goals := shardingReport(t, tt.change)
			g := goals[tt.goal]
			require.NotNil(t, g)
			assert.Equal(t, tt.known, g.known, "%v", g.measured)
			assert.Equal(t, tt.met, g.met, "%v", g.measured)
		})
	}
}

func TestReportShardingFailedConfiguration(t *testing.T) {
	section, _ := shardingReport(t, func(s []shardingResult) { s[6].Err = "mpirun -np 4: signal: killed" })
	assert.Contains(t, section, "| `gradients` | 4 | not measured: mpirun -np 4: signal: killed |")
	assert.Contains(t, section, "| peak memory | `gradients` on 4 processes: peak RSS per process ≥ 35% below replicated's | — | — |")
}

func TestShardingPlanConfigs(t *testing.T) {
	assert.Equal(t, [][2]string{{"1", "replicated"}, {"2", "replicated"}, {"2", "optimizer"}, {"2", "gradients"},
		{"4", "replicated"}, {"4", "optimizer"}, {"4", "gradients"}}, shardingJob53M().configs())
	assert.GreaterOrEqual(t, shardingJob53M().Config.Model.bytes()/4, int64(50_000_000), "at least 50 million parameters")
}
