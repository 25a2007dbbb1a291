package bench

import (
	"fmt"
	"math"
	"strings"
)

// The sharding section's goals.
const (
	// goalShardedPeakCut: with ShardGradients on goalShardedPeakProcs processes, each process's peak resident
	// memory is at least this fraction below replicated training's on as many processes.
	goalShardedPeakCut   = 0.35
	goalShardedPeakProcs = 4
	// goalShardedStepTime: a sharded step takes at most this many times a replicated one on as many
	// processes (2 and more).
	goalShardedStepTime = 1.1
)

// shardingReference is the replicated configuration on n processes, nil if it was not measured.
func shardingReference(res *results, n int) *shardingResult {
	for i, s := range res.Sharding {
		if s.Procs == n && s.Strategy == "replicated" && s.Err == "" && len(s.Step.Seconds) > 0 {
			return &res.Sharding[i]
		}
	}
	return nil
}

// stateTolerance is how far a sharded process's optimizer state may be from 1/N of the replicated state:
// one element per moment variable, each of which covers one bucket's block (a block is the bucket's
// length over N rounded up).
func (s shardingResult) stateTolerance() int64 { return int64(s.MomentVars) * 4 }

// shardingGoals judges the sharding section: the optimizer state is split N ways, ShardGradients cuts the
// peak memory, and neither sharded strategy slows a step down much.
func shardingGoals(res *results) []*goal {
	state := &goal{what: "7. Sharding: optimizer state",
		target: "per process = 1/N of replicated's (± 1 element per bucket and moment)"}
	peak := &goal{what: "7. Sharding: peak memory", target: fmt.Sprintf("`gradients` on %d processes: peak RSS per "+
		"process ≥ %.0f%% below replicated's", goalShardedPeakProcs, 100*goalShardedPeakCut)}
	step := &goal{what: "7. Sharding: step time",
		target: fmt.Sprintf("`optimizer` and `gradients` ≤ %.1f× replicated's step time, 2 and 4 processes", goalShardedStepTime)}
	for _, s := range res.Sharding {
		ref := shardingReference(res, s.Procs)
		if s.Strategy == "replicated" || s.Procs < 2 || ref == nil || s.Err != "" || len(s.Step.Seconds) == 0 {
			continue
		}
		label := fmt.Sprintf("%s, %d", s.Strategy, s.Procs)
		want := float64(maxOf(ref.OptimizerState)) / float64(s.Procs)
		var worst float64 // the largest distance from 1/N over the ranks, in bytes
		for _, b := range s.OptimizerState {
			worst = max(worst, math.Abs(float64(b)-want))
		}
		state.judge(worst <= float64(s.stateTolerance()), "%s: %.4f×", label,
			float64(maxOf(s.OptimizerState))/float64(maxOf(ref.OptimizerState)))
		if s.Strategy == "gradients" && s.Procs == goalShardedPeakProcs {
			cut := 1 - float64(maxOf(s.PeakRSS))/float64(maxOf(ref.PeakRSS))
			peak.judge(cut >= goalShardedPeakCut, "%s (%s vs %s)", signedPercent(-cut), formatMB(maxOf(s.PeakRSS)),
				formatMB(maxOf(ref.PeakRSS)))
		}
		q := ratio(ref.Step, s.Step)
		step.judge(q <= goalShardedStepTime, "%s: %.2f×", label, q)
	}
	return []*goal{state, peak, step}
}

func (r *reporter) sharding() {
	res := r.res
	if len(res.Sharding) == 0 {
		return
	}
	p, m := res.Plan.Sharding, res.Machine
	r.p("## 7. Sharding (ZeRO)\n\n")
	var params int64
	for _, s := range res.Sharding {
		params = max(params, s.Params)
	}
	r.p("%s, %.1f million float32 parameters (%s), trained with GoMLX's Adam through the Accelerator "+
		"(`accel.New`, `PrepareModel`, `PrepareOptimizer`, `Backward`, `Step`, `ZeroGrad`) on synthetic batches "+
		"of %d examples per process, K = %d, under each strategy of `accel.WithSharding`. Every configuration "+
		"is a fresh mpirun job, run %s, so a process's peak memory is that configuration's "+
		"alone. Per process: *optimizer state* is the bytes of the variables whose name ends in `_moment`; "+
		"*peak RSS* is VmHWM at the end of the job, the largest over the ranks and rounds; *step* is Backward + "+
		"Step + ZeroGrad after %d warm-up steps, %d timed steps per round, each started by a barrier and "+
		"counted as its slowest rank's: the median over the rounds' steps. Ratios are against replicated "+
		"training on as many processes. On one process every strategy runs replicated, so it is measured once.\n\n",
		p.Config.Model.shortName(), float64(params)/1e6, formatMB(params*4), p.Config.Batch, p.Config.K,
		timesInterleaved(p.Rounds), p.Warmup, p.Steps)
	openblas := "unset"
	if m.OpenBLASCore != "" {
		openblas = "`" + m.OpenBLASCore + "`"
	}
	r.p("Machine: %s, %d cores, `OPENBLAS_CORETYPE` %s. With more processes than cores the processes share "+
		"them, so step times grow with N; compare strategies at the same N.\n\n", orDash(m.CPU), m.Cores, openblas)
	var rows [][]string
	for _, s := range res.Sharding {
		if s.Err != "" {
			rows = append(rows, []string{"`" + s.Strategy + "`", fmt.Sprint(s.Procs), "not measured: " + s.Err, "", "", "", "", ""})
			continue
		}
		ref := shardingReference(res, s.Procs)
		ratios := []string{"—", "—", "—"}
		if ref != nil && s.Strategy != "replicated" {
			ratios = []string{
				fmt.Sprintf("%.3f×", float64(maxOf(s.OptimizerState))/float64(maxOf(ref.OptimizerState))),
				fmt.Sprintf("%.2f×", float64(maxOf(s.PeakRSS))/float64(maxOf(ref.PeakRSS))),
				fmt.Sprintf("%.2f×", ratio(ref.Step, s.Step))}
		}
		rows = append(rows, append([]string{"`" + s.Strategy + "`", fmt.Sprint(s.Procs),
			fmt.Sprintf("%.1f", float64(maxOf(s.OptimizerState))/(1<<20)), fmt.Sprintf("%.0f", float64(maxOf(s.PeakRSS))/(1<<20)),
			msCell(s.Step)}, ratios...))
	}
	r.table([]string{"Strategy", ">Processes", ">Optimizer state per process (MB)", ">Peak RSS per process (MB)",
		">Step (ms)", ">State / replicated", ">Peak / replicated", ">Step / replicated"}, rows)
	var goalRows [][]string
	for _, g := range shardingGoals(res) {
		met := "no"
		switch {
		case !g.known:
			met = "—"
		case g.met:
			met = "**yes**"
		}
		goalRows = append(goalRows, []string{strings.TrimPrefix(g.what, "7. Sharding: "), g.target,
			orDash(strings.Join(g.measured, "; ")), met})
	}
	r.table([]string{"Goal", "Target", "Measured", "Met"}, goalRows)
	r.p("Where a step's time goes (per step, the slowest rank's, mean over the rounds; *waits* are time blocked " +
		"in each collective, *update* is goaccel's optimizer step, which sharded includes refreshing the parameter " +
		"blocks and the all-gather):\n\n")
	rows = nil
	for _, s := range res.Sharding {
		if s.Err != "" {
			continue
		}
		b := s.PerStep
		rows = append(rows, []string{"`" + s.Strategy + "`", fmt.Sprint(s.Procs), msCell(s.Backward), msCell(s.Update),
			ms(b.ModelCompute), ms(b.OptimizerCompute), ms(b.AllReduceWait), ms(b.ReduceScatterWait), ms(b.AllGatherWait),
			fmt.Sprintf("%.0f / %.0f", float64(maxOf(s.LiveHeap))/(1<<20), float64(maxOf(s.PeakRSS))/(1<<20))})
	}
	r.table([]string{"Strategy", ">Processes", ">Backward + sync", ">Step + ZeroGrad", ">Forward/backward compute",
		">Optimizer step", ">All-reduce wait", ">Reduce-scatter wait", ">All-gather wait", ">Live heap / peak RSS (MB)"}, rows)
}

// timesInterleaved is "once" or "twice, the configurations interleaved".
func timesInterleaved(rounds int) string {
	switch rounds {
	case 1:
		return "once"
	case 2:
		return "twice, the configurations interleaved"
	}
	return fmt.Sprintf("%d times, the configurations interleaved", rounds)
}

// msCell is a median in milliseconds with its spread: "123.4 ±5%".
func msCell(s series) string {
	if len(s.Seconds) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f ±%.0f%%", 1e3*s.median(), 100*s.spread())
}

func ms(sec float64) string { return fmt.Sprintf("%.1f", 1e3*sec) }
