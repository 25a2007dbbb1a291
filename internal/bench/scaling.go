package bench

import (
	"fmt"
	"math"
	"slices"

	"github.com/goaccel/goaccel/accumulate"
)

// The α-β model of a training step (docs/scaling.md): a step is its computation plus the communication its
// mode needs, each all-reduce of S bytes across N processes costing what a ring all-reduce costs,
// 2(N−1)·α + 2(N−1)/N·S·β, with α the latency of one message and β the time per byte a process sends. α and
// β are fitted to all-reduces timed alone on the link; the computation, PowerSGD's arithmetic and the plan's
// buckets are measured or read from this machine. It predicts the end-to-end runs of section 6 (the check)
// and, from the same parts, the scaling efficiency of 8 to 256 processes.

// linkModel is a link as the model sees it: α in seconds per message, β in seconds per byte.
type linkModel struct {
	Alpha, Beta float64
}

// allReduce is a ring all-reduce of bytes across n processes.
func (l linkModel) allReduce(n int, bytes float64) float64 {
	if n < 2 || bytes <= 0 {
		return 0
	}
	return 2*float64(n-1)*l.Alpha + busFactor(n)*bytes*l.Beta
}

// fitLink fits α and β to all-reduce times across n processes by least squares on
// t = 2(n−1)·α + 2(n−1)/n·S·β, each point weighted by 1/t so that the small all-reduces, which carry α, count
// as much as the large ones, which carry β. Neither may be negative: a fit that wants one is redone with it
// at zero. ok is false without two sizes.
func fitLink(n int, points []sizedSeries) (_ linkModel, ok bool) {
	var xs, ys, ws []float64
	for _, p := range points {
		if len(p.Time.Seconds) == 0 || p.Bytes <= 0 {
			continue
		}
		t := p.Time.median()
		xs, ys, ws = append(xs, busFactor(n)*float64(p.Bytes)), append(ys, t), append(ws, 1/(t*t))
	}
	if len(xs) < 2 || n < 2 {
		return linkModel{}, false
	}
	m := 2 * float64(n-1) // messages
	// Weighted least squares of y = a·m + b·x for a, b.
	var sw, sx, sy, sxx, sxy float64
	for i := range xs {
		sw += ws[i]
		sx += ws[i] * xs[i]
		sy += ws[i] * ys[i]
		sxx += ws[i] * xs[i] * xs[i]
		sxy += ws[i] * xs[i] * ys[i]
	}
	det := sw*sxx - sx*sx
	if det == 0 {
		return linkModel{}, false
	}
	intercept := (sxx*sy - sx*sxy) / det
	slope := (sw*sxy - sx*sy) / det
	switch {
	case slope < 0:
		return linkModel{Alpha: max(sy/sw, 0) / m}, true
	case intercept < 0:
		return linkModel{Beta: sxy / sxx}, true
	}
	return linkModel{Alpha: intercept / m, Beta: slope}, true
}

// commPlan is what one sync of a model moves: the default plan's buckets in bytes, and the all-reduces of a
// PowerSGD sync at the plan's rank (per bucket: the uncompressed rest, the P factors and the Q factors, as
// accumulate's PowerSGD hook sends them).
type commPlan struct {
	Buckets  []float64
	PowerSGD []float64
}

// newCommPlan lays out a model's gradients as goaccel does, and PowerSGD's factors at rank (0: none), with
// the hook's rule for what it compresses: an n×m matrix (the first axis × the rest) when
// n·m > MinCompressionRate·r·(n+m).
func newCommPlan(l gradientLayout, rank int) (commPlan, error) {
	plan, err := accumulate.NewPlan(l.params(), 0, defaultBucketCapBytes)
	if err != nil {
		return commPlan{}, err
	}
	var c commPlan
	const minCompressionRate = 2 // accumulate.PowerSGDConfig's default
	for _, b := range plan.Buckets {
		c.Buckets = append(c.Buckets, float64(b.Bytes()))
		if rank <= 0 {
			continue
		}
		var rest, ps, qs int
		for _, slot := range b.Slots {
			dims := plan.Params[slot.Param].Shape.Dimensions
			if len(dims) >= 2 {
				n := dims[0]
				m := slot.Size / max(n, 1)
				if float64(n)*float64(m) > minCompressionRate*float64(rank)*float64(n+m) {
					ps, qs = ps+n*rank, qs+m*rank
					continue
				}
			}
			rest += slot.Size
		}
		size := float64(b.DType.Size())
		for _, elems := range []int{rest, ps, qs} {
			if elems > 0 {
				c.PowerSGD = append(c.PowerSGD, float64(elems)*size)
			}
		}
	}
	return c, nil
}

// bytes sums sizes.
func sum(sizes []float64) float64 {
	t := 0.0
	for _, s := range sizes {
		t += s
	}
	return t
}

// stepModel is one configuration of the model: the processes, their link, the computation of an optimizer
// step and what a sync moves.
type stepModel struct {
	Procs   int
	Link    linkModel
	Compute float64 // seconds per optimizer step on each process: forward, backward and update
	Plan    commPlan
	// PowerSGDArithmetic is the host's time per PowerSGD sync besides its all-reduces (the factors' products
	// and the orthonormalisation); PowerSGDStart the syncs before it compresses, Steps the run's optimizer
	// steps (0: steady state, every sync compressed).
	PowerSGDArithmetic float64
	PowerSGDStart      int
	Steps              int
	LocalSteps         int // H of local SGD and DiLoCo
	// Overlap is the share of Compute that communication can hide behind (the backward's, where a framework
	// starts a bucket's all-reduce as soon as its gradients are ready). goaccel syncs after the backward: 0.
	Overlap float64
	// BucketBytes and RateBits describe an emulated link's token bucket (0: a cable, none): while the link
	// is idle for the computation it banks up to BucketBytes of tokens, and that many bytes of the next
	// sync pass at the machine's speed, MachineBeta seconds per byte (the unthrottled link's β).
	BucketBytes, RateBits int64
	MachineBeta           float64
}

// allReduces is the time of all-reduces of sizes, less what the token bucket banked during idle seconds.
func (m stepModel) allReduces(sizes []float64, idle float64) float64 {
	t := 0.0
	for _, s := range sizes {
		t += m.Link.allReduce(m.Procs, s)
	}
	if m.BucketBytes > 0 && m.RateBits > 0 && m.Procs > 1 {
		credit := min(float64(m.BucketBytes), idle*float64(m.RateBits)/8, busFactor(m.Procs)*sum(sizes))
		t -= credit * max(m.Link.Beta-m.MachineBeta, 0)
	}
	return max(t, 0)
}

// comm is the mode's communication per optimizer step, averaged over the run's steps.
func (m stepModel) comm(mode string) (float64, error) {
	full := m.allReduces(m.Plan.Buckets, m.Compute)
	switch mode {
	case modePlain:
		return full, nil
	case modeBF16:
		half := make([]float64, len(m.Plan.Buckets))
		for i, b := range m.Plan.Buckets {
			half[i] = b / 2
		}
		return m.allReduces(half, m.Compute), nil
	case modePowerSGD:
		if len(m.Plan.PowerSGD) == 0 {
			return 0, fmt.Errorf("scaling: the plan has no PowerSGD factors")
		}
		compressed := m.allReduces(m.Plan.PowerSGD, m.Compute) + m.PowerSGDArithmetic
		if m.Steps <= 0 {
			return compressed, nil
		}
		exact := float64(min(m.PowerSGDStart, m.Steps))
		return (exact*full + (float64(m.Steps)-exact)*compressed) / float64(m.Steps), nil
	case modeLocalSGD, modeDiLoCo:
		if m.LocalSteps < 1 {
			return 0, fmt.Errorf("scaling: %s needs H", mode)
		}
		// One average of the parameters (the gradients' buckets) after H steps of computing.
		return m.allReduces(m.Plan.Buckets, float64(m.LocalSteps)*m.Compute) / float64(m.LocalSteps), nil
	}
	return 0, fmt.Errorf("scaling: unknown mode %q", mode)
}

// step is the predicted time of an optimizer step: the computation, and the communication it does not hide.
func (m stepModel) step(mode string) (float64, error) {
	c, err := m.comm(mode)
	if err != nil {
		return 0, err
	}
	hidden := min(m.Overlap*m.Compute, c)
	return m.Compute + c - hidden, nil
}

// efficiency is the step's computation over its time: the throughput of Procs processes over Procs times
// one process's, which communicates nothing.
func (m stepModel) efficiency(mode string) (float64, error) {
	t, err := m.step(mode)
	if err != nil || t <= 0 {
		return 0, err
	}
	return m.Compute / t, nil
}

// bytesPerStep is what rank 0 hands to all-reduces per optimizer step in a mode, averaged over the run's
// steps: the counterpart of the demo's collective_bytes over its optimizer steps, less what every mode moves
// once.
func (m stepModel) bytesPerStep(mode string) float64 {
	switch mode {
	case modeBF16:
		return sum(m.Plan.Buckets) / 2
	case modePowerSGD:
		if m.Steps <= 0 {
			return sum(m.Plan.PowerSGD)
		}
		exact := float64(min(m.PowerSGDStart, m.Steps))
		return (exact*sum(m.Plan.Buckets) + (float64(m.Steps)-exact)*sum(m.Plan.PowerSGD)) / float64(m.Steps)
	case modeLocalSGD, modeDiLoCo:
		return sum(m.Plan.Buckets) / float64(max(m.LocalSteps, 1))
	}
	return sum(m.Plan.Buckets)
}

// scalingModes are the modes the model predicts, in the order of the page.
var scalingModes = []string{modePlain, modeBF16, modePowerSGD, modeLocalSGD, modeDiLoCo}

// modeName is a mode for people.
func modeName(mode string, p networkPlan) string {
	switch mode {
	case modeBF16:
		return "bf16"
	case modePowerSGD:
		return fmt.Sprintf("PowerSGD (rank %d)", p.PowerSGDRank)
	case modeLocalSGD:
		return fmt.Sprintf("local SGD (H=%d)", p.LocalSteps)
	case modeDiLoCo:
		return fmt.Sprintf("DiLoCo (H=%d)", p.LocalSteps)
	}
	return "plain"
}

// modelParts are the model's measured parts at one number of processes: the link at each rate, the
// computation per step, PowerSGD's arithmetic.
type modelParts struct {
	Procs              int
	Links              map[int64]linkModel // by rate, 0 unthrottled
	Compute            float64
	PowerSGDArithmetic float64
	// ComputeFrom says where Compute was taken from, for the page.
	ComputeFrom string
}

// networkResults are section 6's results at n processes (Procs 0 counts as the plan's Hosts).
func networkResults(res *results, n int) []networkResult {
	var out []networkResult
	for _, r := range res.Network {
		procs := r.Procs
		if procs == 0 {
			procs = res.Plan.Network.Hosts
		}
		if procs == n && r.Emulated {
			out = append(out, r)
		}
	}
	return out
}

// findRun is the run of an implementation, model slug, mode and K at one rate, if it ran.
func (r networkResult) findRun(impl, model, mode string, k int) (networkRun, bool) {
	i := slices.IndexFunc(r.Runs, func(run networkRun) bool {
		return run.Impl == impl && run.Model == model && run.mode() == mode && run.K == k && len(run.StepSeconds) > 0
	})
	if i < 0 {
		return networkRun{}, false
	}
	return r.Runs[i], true
}

// measuredParts reads the model's parts at n processes from section 6's results for a model: α and β at
// every rate, fitted to its all-reduces alone; the computation per step from the unthrottled local SGD run
// (the mode that communicates least: its step less the model's communication for it), or the plain run
// without one; PowerSGD's arithmetic from its sync alone unthrottled, less the model's all-reduces for it.
func measuredParts(res *results, n int, m networkModel, k int) (modelParts, bool) {
	p := res.Plan.Network
	parts := modelParts{Procs: n, Links: map[int64]linkModel{}}
	var unthrottled *networkResult
	rates := networkResults(res, n)
	for i, r := range rates {
		if l, ok := fitLink(n, r.AllReduce); ok {
			parts.Links[r.RateBits] = l
		}
		if r.RateBits == 0 {
			unthrottled = &rates[i]
		}
	}
	link, ok := parts.Links[0]
	if unthrottled == nil || !ok {
		return parts, false
	}
	plan, err := newCommPlan(m.layout(), p.PowerSGDRank)
	if err != nil {
		return parts, false
	}
	base := stepModel{Procs: n, Link: link, Plan: plan, LocalSteps: p.LocalSteps}
	for _, mode := range []string{modeLocalSGD, modePlain} {
		run, ok := unthrottled.findRun("goaccel", m.slug(), mode, k)
		if !ok {
			continue
		}
		c, err := base.comm(mode)
		if err != nil {
			return parts, false
		}
		parts.Compute = max(quantile(run.StepSeconds, 0.5)-c, 0)
		parts.ComputeFrom = modeName(mode, p)
		break
	}
	if parts.Compute == 0 {
		return parts, false
	}
	if i := slices.IndexFunc(unthrottled.Sync, func(s networkSyncResult) bool { return s.Layout == m.slug() }); i >= 0 &&
		len(unthrottled.Sync[i].PowerSGD.Seconds) > 0 {
		factors := 0.0
		for _, s := range plan.PowerSGD {
			factors += link.allReduce(n, s)
		}
		parts.PowerSGDArithmetic = max(unthrottled.Sync[i].PowerSGD.median()-factors, 0)
	}
	return parts, true
}

// prediction is the model's step time for one end-to-end run next to the run's.
type prediction struct {
	Procs            int
	Rate             networkResult
	Mode             string
	Predicted        float64 // seconds per step, on the emulated link (its token bucket's credit counted)
	PredictedCable   float64 // the same without the token bucket, as on a cable
	Measured         float64
	Calibration      bool // the run the computation was taken from: equal by construction
	PredictedBytes   float64
	MeasuredBytes    float64
	PowerSGDStartsAt int
}

// within is whether the prediction is within frac of the measurement.
func (p prediction) within(frac float64) bool {
	return math.Abs(p.Predicted-p.Measured) <= frac*p.Measured
}

// predictRuns predicts every goaccel run of the model at K at n processes from the parts measured there.
func predictRuns(res *results, n int, m networkModel, k int) ([]prediction, modelParts, bool) {
	p := res.Plan.Network
	parts, ok := measuredParts(res, n, m, k)
	if !ok {
		return nil, parts, false
	}
	plan, err := newCommPlan(m.layout(), p.PowerSGDRank)
	if err != nil {
		return nil, parts, false
	}
	var out []prediction
	for _, r := range networkResults(res, n) {
		link, ok := parts.Links[r.RateBits]
		if !ok {
			continue
		}
		for _, mode := range scalingModes {
			run, ok := r.findRun("goaccel", m.slug(), mode, k)
			if !ok {
				continue
			}
			sm := stepModel{Procs: n, Link: link, Compute: parts.Compute, Plan: plan, PowerSGDArithmetic: parts.PowerSGDArithmetic,
				PowerSGDStart: p.PowerSGDStart, Steps: int(quantile(int64s(run.Steps), 0.5)), LocalSteps: p.LocalSteps}
			cable, err := sm.step(mode)
			if err != nil {
				continue
			}
			sm.BucketBytes, sm.RateBits, sm.MachineBeta = r.BurstBytes, r.RateBits, parts.Links[0].Beta
			emulated, _ := sm.step(mode)
			pr := prediction{Procs: n, Rate: r, Mode: mode, Predicted: emulated, PredictedCable: cable,
				Measured: quantile(run.StepSeconds, 0.5), PredictedBytes: sm.bytesPerStep(mode),
				Calibration: r.RateBits == 0 && modeName(mode, p) == parts.ComputeFrom}
			pr.MeasuredBytes = r.netBytesPerStep(run, m, k)
			out = append(out, pr)
		}
	}
	return out, parts, true
}

// onceBytes is what the plain goaccel run of the model at K handed to all-reduces besides its steps' syncs
// (every gradient every step): bytes every mode moves once, whatever it sends per step (0 without the run).
func (r networkResult) onceBytes(m networkModel, k int) float64 {
	plain, ok := r.findRun("goaccel", m.slug(), modePlain, k)
	if !ok || len(plain.CollectiveBytes) == 0 || len(plain.Steps) == 0 {
		return 0
	}
	return max(float64(plain.CollectiveBytes[0])-float64(plain.Steps[0])*float64(m.layout().bytes()), 0)
}

// netBytesPerStep is what a goaccel run handed to all-reduces per optimizer step, less what every mode moves
// once (onceBytes).
func (r networkResult) netBytesPerStep(run networkRun, m networkModel, k int) float64 {
	if len(run.CollectiveBytes) == 0 || len(run.Steps) == 0 || run.Steps[0] <= 0 {
		return 0
	}
	return (float64(run.CollectiveBytes[0]) - r.onceBytes(m, k)) / float64(run.Steps[0])
}

// int64s converts for quantile.
func int64s(v []int64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// scalingProcs are the process counts the projection covers.
var scalingProcs = []int{8, 16, 32, 64, 128, 256}

// scalingCurve is one mode's projected efficiency at one rate, by scalingProcs.
type scalingCurve struct {
	RateBits   int64
	Mode       string
	Efficiency []float64
}

// projectScaling projects every mode at every rate of links (by rate) to scalingProcs processes, one per
// host, each computing as parts.Compute says, on cables: steady-state PowerSGD (past its start iteration).
func projectScaling(parts modelParts, plan commPlan, localSteps int, rates []int64, links map[int64]linkModel) []scalingCurve {
	var out []scalingCurve
	for _, rate := range rates {
		link, ok := links[rate]
		if !ok {
			continue
		}
		for _, mode := range scalingModes {
			c := scalingCurve{RateBits: rate, Mode: mode}
			for _, n := range scalingProcs {
				sm := stepModel{Procs: n, Link: link, Compute: parts.Compute, Plan: plan,
					PowerSGDArithmetic: parts.PowerSGDArithmetic, LocalSteps: localSteps}
				e, err := sm.efficiency(mode)
				if err != nil {
					break
				}
				c.Efficiency = append(c.Efficiency, e)
			}
			if len(c.Efficiency) == len(scalingProcs) {
				out = append(out, c)
			}
		}
	}
	return out
}
