package bench

import (
	"fmt"
	"math"
	"slices"
)

// The goals of section 6's modes and of the α-β model.
const (
	// goalPowerSGDSpeedup: at goalRateBits on the fewest hosts, PowerSGD's examples/s over goaccel's plain
	// runs', at least; goalPowerSGDVsPyTorch over PyTorch DDP's with powerSGD_hook at the same rank.
	goalPowerSGDSpeedup   = 2.0
	goalPowerSGDVsPyTorch = 1.0
	// goalModeAccuracy: a mode's test accuracy at most this far from plain training's after the same epochs.
	goalModeAccuracy = 0.01
	// goalLocalBytes: local SGD's and DiLoCo's bytes per optimizer step, at least this many times fewer than
	// plain training's.
	goalLocalBytes = 8.0
	// goalModelError: the α-β model's predicted step time within this fraction of the measured one.
	goalModelError = 0.15
)

// pytorchModeName is PyTorch's counterpart of a mode, as the page names it.
func pytorchModeName(mode string) string {
	switch mode {
	case modeBF16:
		return "fp16_compress_hook"
	case modePowerSGD:
		return "powerSGD_hook"
	case modeLocalSGD:
		return "post-local SGD"
	case modeDiLoCo:
		return "—"
	}
	return "default"
}

// modesPlanned says whether the plan runs modes besides plain training.
func modesPlanned(p networkPlan) bool { return len(p.modes()) > 1 }

// perStep is a run's median of v over its optimizer steps (0 without them).
func perStep(v []float64, steps []int64) float64 {
	if len(v) == 0 || len(steps) == 0 {
		return 0
	}
	s := quantile(int64s(steps), 0.5)
	if s == 0 {
		return 0
	}
	return quantile(v, 0.5) / s
}

// bytesPerStep is what rank 0 handed to all-reduces per optimizer step.
func (r networkRun) bytesPerStep() float64 { return perStep(int64s(r.CollectiveBytes), r.Steps) }

// sentPerStep is what host 0's link sent per optimizer step.
func (r networkRun) sentPerStep() float64 {
	sent := make([]float64, len(r.SentBytes))
	for i, b := range r.SentBytes {
		sent[i] = float64(b)
	}
	return perStep(sent, r.Steps)
}

// accuracy is the run's median test accuracy.
func (r networkRun) accuracy() float64 { return quantile(r.TestAccuracy, 0.5) }

// examplesPerSecond is the run's median throughput.
func (r networkRun) examplesPerSecond() float64 { return 1 / r.PerExample.median() }

// modeSubject is the model and K the modes' goals are judged on: the first model, the smallest K.
func modeSubject(p networkPlan) (networkModel, int, bool) {
	if len(p.Models) == 0 || len(p.Ks) == 0 {
		return networkModel{}, 0, false
	}
	return p.Models[0], slices.Min(p.Ks), true
}

// modeGoals judges the modes at goalRateBits: PowerSGD's throughput on the fewest hosts, its accuracy and
// local SGD's and DiLoCo's accuracy and bytes on every cluster size, and the α-β model's predictions.
func modeGoals(res *results) []*goal {
	p := res.Plan.Network
	if !modesPlanned(p) {
		return nil
	}
	m, k, ok := modeSubject(p)
	if !ok {
		return nil
	}
	hosts := p.hostCounts()
	fewest := slices.Min(hosts)
	speed := &goal{what: "6. Network: PowerSGD throughput", target: fmt.Sprintf("PowerSGD (rank %d) ≥ %.0f× goaccel's "+
		"plain examples/s and ≥ %.1f× PyTorch DDP's with powerSGD_hook, at %s, K=%d, %d hosts", p.PowerSGDRank,
		goalPowerSGDSpeedup, goalPowerSGDVsPyTorch, formatBits(goalRateBits), k, fewest)}
	psgdAcc := &goal{what: "6. Network: PowerSGD accuracy", target: fmt.Sprintf("PowerSGD's test accuracy within %.2f "+
		"of plain training's after the same epochs, at %s", goalModeAccuracy, formatBits(goalRateBits))}
	local := &goal{what: "6. Network: local SGD and DiLoCo", target: fmt.Sprintf("test accuracy within %.2f of plain "+
		"training's and ≥ %.0f× fewer bytes per optimizer step (less what every mode moves once), at %s",
		goalModeAccuracy, goalLocalBytes,
		formatBits(goalRateBits))}
	for _, rate := range res.Network {
		if !rate.Emulated || rate.RateBits != goalRateBits {
			continue
		}
		n := rate.procs(p)
		plain, ok := rate.findRun("goaccel", m.slug(), modePlain, k)
		if !ok {
			continue
		}
		if g, ok := rate.findRun("goaccel", m.slug(), modePowerSGD, k); ok {
			if n == fewest {
				q := g.examplesPerSecond() / plain.examplesPerSecond()
				if t, ok := rate.findRun("pytorch", m.slug(), modePowerSGD, k); ok {
					v := g.examplesPerSecond() / t.examplesPerSecond()
					speed.judge(q >= goalPowerSGDSpeedup && v >= goalPowerSGDVsPyTorch,
						"%.2f× plain, %.2f× PyTorch's powerSGD_hook", q, v)
				} else {
					speed.judge(q >= goalPowerSGDSpeedup, "%.2f× plain (PyTorch's powerSGD_hook did not run)", q)
				}
			}
			d := g.accuracy() - plain.accuracy()
			psgdAcc.judge(math.Abs(d) <= goalModeAccuracy, "%d hosts: %+.4f", n, d)
		}
		for _, mode := range []string{modeLocalSGD, modeDiLoCo} {
			g, ok := rate.findRun("goaccel", m.slug(), mode, k)
			if !ok {
				continue
			}
			d := g.accuracy() - plain.accuracy()
			// Judged per step, past what every mode moves once: a run's total also depends on its length.
			whole := plain.bytesPerStep() / g.bytesPerStep()
			fewer := rate.netBytesPerStep(plain, m, k) / rate.netBytesPerStep(g, m, k)
			local.judge(math.Abs(d) <= goalModeAccuracy && fewer >= goalLocalBytes,
				"%s, %d hosts: %+.4f, %.1f× fewer bytes per step (%.1f× over the run)", modeName(mode, p), n, d, fewer, whole)
		}
	}
	model := &goal{what: "6. Network: α-β model", target: fmt.Sprintf("predicted step time within %.0f%% of the "+
		"measured one, every goaccel run on %s hosts", 100*goalModelError, joinAnd(intStrings(hosts)))}
	for _, n := range hosts {
		preds, _, ok := predictRuns(res, n, m, k)
		if !ok {
			continue
		}
		judged, in := 0, 0
		worst := prediction{}
		for _, pr := range preds {
			if pr.Calibration {
				continue
			}
			judged++
			if pr.within(goalModelError) {
				in++
			}
			if math.Abs(pr.Predicted/pr.Measured-1) >= math.Abs(worst.Predicted/math.Max(worst.Measured, 1e-300)-1) ||
				worst.Measured == 0 {
				worst = pr
			}
		}
		if judged > 0 {
			model.judge(in == judged, "%d hosts: %d of %d within (furthest: %s, %s, %+.0f%%)", n, in, judged,
				modeName(worst.Mode, p), worst.Rate.rateName(), 100*(worst.Predicted/worst.Measured-1))
		}
	}
	return []*goal{speed, psgdAcc, local, model}
}

// networkModes renders the modes against PyTorch DDP's counterparts: throughput, bytes and accuracy.
func (r *reporter) networkModes() {
	p := r.res.Plan.Network
	if !modesPlanned(p) {
		return
	}
	for _, m := range p.Models {
		for _, k := range p.Ks {
			var rows [][]string
			for _, rate := range r.res.Network {
				for _, mode := range p.modes() {
					g, ok := rate.findRun("goaccel", m.slug(), mode, k)
					if !ok {
						continue
					}
					t, withTorch := rate.findRun("pytorch", m.slug(), mode, k)
					cell := func(f func(networkRun) string) string {
						if !withTorch {
							return "—"
						}
						return f(t)
					}
					rows = append(rows, []string{r.where(rate), modeName(mode, p), rateCell(g.PerExample),
						pytorchModeName(mode), cell(func(t networkRun) string { return rateCell(t.PerExample) }),
						cell(func(t networkRun) string { return fmt.Sprintf("%.2f×", ratio(g.PerExample, t.PerExample)) }),
						bytesCell(g.bytesPerStep()),
						cell(func(t networkRun) string { return bytesCell(t.bytesPerStep()) }),
						sentCell(g), cell(sentCell), fmt.Sprintf("%.4f", g.accuracy()),
						cell(func(t networkRun) string { return fmt.Sprintf("%.4f", t.accuracy()) })})
				}
			}
			if len(rows) == 0 {
				continue
			}
			r.p("**Modes.** %s, K=%d, %d training examples per run, one pass: goaccel's demo plain, sending bf16 "+
				"(`GOACCEL_GRADIENT_COMPRESSION=bf16`), with PowerSGD at rank %d from optimizer step %d "+
				"(`GOACCEL_POWERSGD=%d:%d`), with local SGD and with DiLoCo at H=%d (`-local-sgd %d`, `-diloco %d`), "+
				"against `fashion_ddp.py` with DDP's default all-reduce, `fp16_compress_hook` (this torch, %s, takes "+
				"`bf16_compress_hook` only with CUDA and NCCL; fp16 sends the same two bytes per element), "+
				"`powerSGD_hook` (`PowerSGDState(matrix_approximation_rank=%d, start_powerSGD_iter=%d)`) and post-local "+
				"SGD (`post_localSGD_hook` with no warm-up and no gradient all-reduce, `PostLocalSGDOptimizer` averaging "+
				"every %d steps); PyTorch has no DiLoCo. *MB per step* is what rank 0 handed to all-reduces over the "+
				"optimizer steps (goaccel's `collective_bytes`; PyTorch's hooks' and averager's all-reduces counted by "+
				"the script, its default all-reduce as every gradient every step); *sent per step* is what host 0's "+
				"link carried, headers, start-up and evaluation included.\n\n",
				m.describe(), k, m.Limit, p.PowerSGDRank, p.PowerSGDStart, p.PowerSGDRank, p.PowerSGDStart, p.LocalSteps,
				p.LocalSteps, p.LocalSteps, "1.13", p.PowerSGDRank, p.PowerSGDStart, p.LocalSteps)
			r.table([]string{"Rate", "goaccel mode", ">goaccel examples/s", "PyTorch DDP", ">PyTorch examples/s",
				">goaccel / PyTorch", ">goaccel MB per step", ">PyTorch MB per step", ">goaccel sent per step",
				">PyTorch sent per step", ">goaccel test accuracy", ">PyTorch test accuracy"}, rows)
			r.unfaithful()
		}
	}
}

// sentCell is what host 0's link sent per step, "—" where not measured.
func sentCell(run networkRun) string {
	if len(run.SentBytes) == 0 {
		return "—"
	}
	return bytesCell(run.sentPerStep())
}

// bytesCell is a size in decimal units, kB below a megabyte: PowerSGD's factors are tens of kB.
func bytesCell(n float64) string {
	if n < 1e6 {
		return fmt.Sprintf("%.1f kB", n/1e3)
	}
	return formatMegabytes(int64(n))
}

// networkModel renders the α-β model: the links it fitted, its parts, its predictions of the end-to-end
// runs next to their measurements, and its projection to more processes.
func (r *reporter) networkModel() {
	p := r.res.Plan.Network
	m, k, ok := modeSubject(p)
	if !ok || len(p.AlphaBetaSizes) == 0 {
		return
	}
	var fits, parts, preds [][]string
	var once []string
	for _, n := range p.hostCounts() {
		pr, mp, ok := predictRuns(r.res, n, m, k)
		if !ok {
			continue
		}
		for _, rate := range networkResults(r.res, n) {
			l, ok := mp.Links[rate.RateBits]
			if !ok {
				continue
			}
			var points []string
			for _, a := range rate.AllReduce {
				points = append(points, fmt.Sprintf("%s: %s", bytesCell(float64(a.Bytes)), formatDuration(a.Time.median())))
			}
			fits = append(fits, []string{r.where(rate), formatDuration(l.Alpha), betaCell(l.Beta), joinAnd(points)})
		}
		arith := "—"
		if mp.PowerSGDArithmetic > 0 {
			arith = formatDuration(mp.PowerSGDArithmetic)
		}
		parts = append(parts, []string{fmt.Sprint(n), formatDuration(mp.Compute), mp.ComputeFrom,
			fmt.Sprintf("%.1f µs", 1e6*mp.Compute/float64(p.Batch*k)), arith})
		for _, x := range pr {
			within := "yes"
			switch {
			case x.Calibration:
				within = "calibration"
			case !x.within(goalModelError):
				within = "no"
			}
			preds = append(preds, []string{r.where(x.Rate), modeName(x.Mode, p), formatDuration(x.Predicted),
				formatDuration(x.PredictedCable), formatDuration(x.Measured), fmt.Sprintf("%+.0f%%", 100*(x.Predicted/x.Measured-1)),
				within, bytesCell(x.PredictedBytes), bytesCell(x.MeasuredBytes)})
			if x.Rate.onceBytes(m, k) > 0 {
				once = append(once, fmt.Sprintf("%s on %d hosts", formatMegabytes(int64(x.Rate.onceBytes(m, k))), n))
			}
		}
	}
	if len(preds) == 0 {
		return
	}
	r.p("**The α-β model** ([scaling.md](scaling.md)). A step is its computation plus its mode's communication, "+
		"each all-reduce of S bytes across N processes costing 2(N−1)·α + 2(N−1)/N·S·β, per bucket of the plan. α "+
		"and β are fitted (least squares, each point weighted by 1/t) to float32 all-reduces of %s timed alone at "+
		"each rate, back to back:\n\n", joinAnd(sizeStrings(p.AlphaBetaSizes)))
	r.table([]string{"Rate", ">α", ">1/β", "All-reduces"}, fits)
	r.p("The computation per optimizer step is the unthrottled run of the mode that communicates least (its " +
		"step less the model's communication for it): forward, backward, update and the loop, per process. " +
		"PowerSGD's arithmetic is its sync alone unthrottled less the model's all-reduces of its factors.\n\n")
	r.table([]string{">Hosts", ">Computation per step", "Taken from", ">Per example", ">PowerSGD arithmetic per sync"}, parts)
	r.p("Each goaccel run predicted from these parts: *on the link* counts the token bucket's credit (what the "+
		"link banks while the processes compute, up to its bucket, passes at the machine's speed), *on a cable* "+
		"does not. PowerSGD's runs average %d exact syncs with compressed ones; local SGD and DiLoCo average the "+
		"parameters' buckets once every H steps. goaccel syncs after the backward, so nothing hides (overlap 0). "+
		"The run the computation was taken from is marked *calibration*: equal by construction. Bytes per step "+
		"leave out what every mode moves once besides its steps (the plain run's all-reduced bytes less every "+
		"gradient every step: %s).\n\n", p.PowerSGDStart, joinAnd(dedupe(once)))
	r.table([]string{"Rate", "Mode", ">Predicted on the link", ">Predicted on a cable", ">Measured", ">Predicted − measured",
		"Within 15%", ">Predicted MB per step", ">Measured MB per step"}, preds)
	r.unfaithful()
	curves, base := scalingProjection(r.res)
	if len(curves) == 0 {
		return
	}
	var rows [][]string
	for _, c := range curves {
		row := []string{formatBits(float64(c.RateBits)), modeName(c.Mode, p)}
		for _, e := range c.Efficiency {
			row = append(row, fmt.Sprintf("%.2f", e))
		}
		rows = append(rows, row)
	}
	columns := []string{"Rate", "Mode"}
	for _, n := range scalingProcs {
		columns = append(columns, fmt.Sprintf(">%d", n))
	}
	r.p("**Projected scaling efficiency** (the step's computation over its time, one process per host on "+
		"cables, PowerSGD past its start iteration), from the parts measured on %d hosts, where each process has a "+
		"core of its own (α no less than the unthrottled fit's: latency does not depend on the rate):\n\n", base.Procs)
	r.table(columns, rows)
}

// projectionBase is where the projection's parts come from: the cluster size they were measured on.
type projectionBase struct {
	Procs int
}

// scalingProjection projects the model to scalingProcs at the throttled rates from 1 to 10 Gbit/s, from the
// parts of the fewest hosts: there each process has a core of its own, as on real hosts; where processes
// outnumber the cores, MPI's polling and the scheduler's turns make every all-reduce and step slower, which
// is the machine and not the link.
func scalingProjection(res *results) ([]scalingCurve, projectionBase) {
	p := res.Plan.Network
	m, k, ok := modeSubject(p)
	if !ok {
		return nil, projectionBase{}
	}
	var all []modelParts
	for _, n := range p.hostCounts() {
		if mp, ok := measuredParts(res, n, m, k); ok {
			all = append(all, mp)
		}
	}
	if len(all) == 0 {
		return nil, projectionBase{}
	}
	fewest := all[0]
	plan, err := newCommPlan(m.layout(), p.PowerSGDRank)
	if err != nil {
		return nil, projectionBase{}
	}
	var rates []int64
	links := map[int64]linkModel{}
	for rate, l := range fewest.Links {
		if rate >= goalRateBits && rate <= 10*goalRateBits {
			rates = append(rates, rate)
			// A message's latency does not depend on the rate, and a throttled fit, where bytes dominate
			// every point, pins it down worst: the unthrottled fit's α is the floor.
			l.Alpha = max(l.Alpha, fewest.Links[0].Alpha)
			links[rate] = l
		}
	}
	slices.Sort(rates)
	return projectScaling(fewest, plan, p.LocalSteps, rates, links), projectionBase{Procs: fewest.Procs}
}

// betaCell is 1/β as a rate: "0.95 Gbit/s".
func betaCell(beta float64) string {
	if beta <= 0 {
		return "—"
	}
	return formatBits(8 / beta)
}

// sizeStrings are sizes in kB or MB.
func sizeStrings(sizes []int64) []string {
	out := make([]string, len(sizes))
	for i, s := range sizes {
		out[i] = bytesCell(float64(s))
	}
	return out
}
