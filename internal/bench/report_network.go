package bench

import (
	"fmt"
	"slices"
	"strings"
)

// The goals of section 6.
const (
	// goalNetworkVsPyTorch: goaccel's examples/s over PyTorch DDP's across the hosts, at least, at every rate
	// and K, for each model of the section.
	goalNetworkVsPyTorch = 1.0
	// goalSyncVsLinkLimit: at goalRateBits, the bucketed sync's time over the link's limit 2(N−1)/N·S/B, at
	// most.
	goalSyncVsLinkLimit = 1.1
	// goalCompressionSpeedup: at goalRateBits, the bucketed sync's time over the same sync sent as bf16, at
	// least.
	goalCompressionSpeedup = 1.7
	goalRateBits           = 1_000_000_000
)

// networkPair is a model's goaccel and PyTorch runs at one rate and K.
type networkPair struct {
	rate             networkResult
	goaccel, pytorch networkRun
}

// ratio is goaccel's examples/s over PyTorch's.
func (p networkPair) ratio() float64 { return ratio(p.goaccel.PerExample, p.pytorch.PerExample) }

// networkPairs are the runs of a model (by slug) as goaccel–PyTorch pairs, by rate and then K.
func networkPairs(res *results, model string) []networkPair {
	var out []networkPair
	for _, rate := range res.Network {
		for _, g := range rate.Runs {
			for _, t := range rate.Runs {
				if g.Model == model && t.Model == model && g.Impl == "goaccel" && t.Impl == "pytorch" && g.K == t.K &&
					g.mode() == modePlain && t.mode() == modePlain && len(g.PerExample.Seconds) > 0 &&
					len(t.PerExample.Seconds) > 0 {
					out = append(out, networkPair{rate, g, t})
				}
			}
		}
	}
	return out
}

// networkGoals judges section 6: one throughput goal per model, the sync against the link's limit and
// compression, both at goalRateBits.
func networkGoals(res *results) []*goal {
	var out []*goal
	for _, m := range res.Plan.Network.Models {
		g := &goal{what: "6. Network: " + m.describe() + " throughput", target: fmt.Sprintf("goaccel ≥ %.1f× PyTorch "+
			"DDP's examples/s across the hosts, at every rate and K", goalNetworkVsPyTorch)}
		for _, pair := range networkPairs(res, m.slug()) {
			q := pair.ratio()
			g.judge(q >= goalNetworkVsPyTorch, "%s, K=%d: %.2f×", withHosts(res.Plan.Network, pair.rate,
				pair.rate.rateName()), pair.goaccel.K, q)
		}
		out = append(out, g)
	}
	limit := &goal{what: "6. Network: sync against the link", target: fmt.Sprintf("bucketed sync ≤ %.1f × the link's "+
		"limit 2(N−1)/N·S/B at %s", goalSyncVsLinkLimit, formatBits(goalRateBits))}
	compression := &goal{what: "6. Network: bf16 compression", target: fmt.Sprintf("bucketed sync ≥ %.1f× faster "+
		"sent as bf16, at %s", goalCompressionSpeedup, formatBits(goalRateBits))}
	for _, rate := range res.Network {
		if !rate.Emulated || rate.RateBits != goalRateBits {
			continue
		}
		for _, s := range rate.Sync {
			if len(s.Bucketed.Seconds) == 0 {
				continue
			}
			q := s.Bucketed.median() / linkLimit(s.Bytes, s.Ranks, rate.RateBits)
			limit.judge(q <= goalSyncVsLinkLimit, "%s: %.2f×", withHosts(res.Plan.Network, rate, s.Model), q)
			c := ratio(s.BucketedBF16, s.Bucketed)
			compression.judge(c >= goalCompressionSpeedup, "%s: %.2f×", withHosts(res.Plan.Network, rate, s.Model), c)
		}
	}
	return append(append(out, limit, compression), modeGoals(res)...)
}

// network renders section 6.
func (r *reporter) network() {
	rates := r.res.Network
	if len(rates) == 0 {
		return
	}
	p := r.res.Plan.Network
	where := fmt.Sprintf("an emulated cluster of %s hosts (network namespaces joined by a bridge, one veth link per "+
		"host), built once per rate, the rate set on both ends of every link by a token-bucket filter",
		joinOr(intStrings(p.hostCounts())))
	if !rates[0].Emulated {
		where = "the hosts " + rates[0].Hosts + ", their network as it is"
	}
	r.section("## 6. On a network", "6-on-a-network", "One process per host, one compute thread each, on %s. "+
		"Open MPI's TCP transport carries goaccel's gradients (mpirun started as `accel launch --hosts` starts "+
		"it), gloo PyTorch's.", where)
	r.networkLinks()
	r.networkEndToEnd()
	r.networkModes()
	r.networkSync()
	r.networkOverlap()
	r.networkModel()
}

// where names a rate for a table's first column: with one cluster size the rate, with several the hosts
// too. Rates above 1 Gbit/s are marked: a token bucket there is not a faithful link (see the note beside
// their tables).
func (r *reporter) where(rate networkResult) string {
	name := rate.rateName()
	if rate.Emulated && rate.RateBits > goalRateBits {
		name += "*"
	}
	return withHosts(r.res.Plan.Network, rate, name)
}

// withHosts prefixes what is said of a rate with its cluster's size, where the plan has several.
func withHosts(p networkPlan, rate networkResult, what string) string {
	if len(p.hostCounts()) < 2 {
		return what
	}
	return fmt.Sprintf("%d hosts, %s", rate.procs(p), what)
}

// unfaithful is the note beside tables that hold a rate marked by where.
func (r *reporter) unfaithful() {
	for _, rate := range r.res.Network {
		if rate.Emulated && rate.RateBits > goalRateBits {
			r.p("\\* Above 1 Gbit/s the emulated link is not faithful: the token-bucket filter banks tokens while the " +
				"link is idle and lets a whole sync through at the machine's speed, and this machine's copying between " +
				"namespaces bounds the rate itself; read these rows as a fast link, not as 10 Gbit/s Ethernet.\n\n")
			return
		}
	}
}

// procs is the number of hosts of a result.
func (r networkResult) procs(p networkPlan) int {
	if r.Procs > 0 {
		return r.Procs
	}
	return p.Hosts
}

func (r *reporter) networkLinks() {
	rates := r.res.Network
	if !rates[0].Emulated {
		return
	}
	var rows [][]string
	var machineBound []string
	for _, rate := range rates {
		burst, share := "—", "—"
		if rate.RateBits > 0 {
			burst = formatMegabytes(rate.BurstBytes)
			share = fmt.Sprintf("%.2f", rate.LinkBits/float64(rate.RateBits))
			if rate.LinkBits < 0.9*float64(rate.RateBits) {
				machineBound = append(machineBound, rate.rateName())
			}
		}
		rows = append(rows, []string{r.where(rate), burst, formatBits(rate.LinkBits), share})
	}
	r.p("**The links.** Before anything else at a rate, one TCP stream from host 0 to host 1 for about %s "+
		"(the first fifth, where the token bucket's burst passes, not counted) checks that the limiter is on: a "+
		"link that carries more than %.1f× its rate stops the run. MB are 10⁶ bytes in this section, as rates are "+
		"10⁹ bits per second.\n\n", formatDuration(r.res.Plan.Network.LinkCheck.Seconds()), limiterSlack)
	r.table([]string{"Rate", ">Token bucket", ">One TCP stream", ">Stream / rate"}, rows)
	if len(machineBound) > 0 {
		r.p("At %s the link carried less than 90%% of the rate: this machine's copying between namespaces, not the "+
			"limiter, bounds it there, so that rate measures the same network as unthrottled.\n\n",
			joinAnd(machineBound))
	}
}

func (r *reporter) networkEndToEnd() {
	p := r.res.Plan.Network
	r.p("**End to end.** The demo's job, as in the section above but across the hosts: Adam (learning rate %g), %d "+
		"examples per micro-batch per process, one pass over the first training examples (below), seed %d; "+
		"`bin/grad_accum` under mpirun against `fashion_ddp.py`, one process per host started through the launch "+
		"agent (gloo on the hosts' cluster interface). Examples/s of the training loop; medians over %d run(s) of "+
		"each.\n\n", p.LR, p.Batch, p.Seed, p.Rounds)
	for _, m := range p.Models {
		pairs := networkPairs(r.res, m.slug())
		if len(pairs) == 0 {
			continue
		}
		var rows [][]string
		for _, pair := range pairs {
			g, t := pair.goaccel, pair.pytorch
			rows = append(rows, []string{r.where(pair.rate), fmt.Sprint(g.K), rateCell(g.PerExample),
				rateCell(t.PerExample), fmt.Sprintf("%.2f×", pair.ratio()), fmt.Sprintf("%.4f", quantile(g.TestAccuracy, 0.5)),
				fmt.Sprintf("%.4f", quantile(t.TestAccuracy, 0.5))})
		}
		r.p("%s, %d training examples, %s per sync:\n\n", m.describe(), m.Limit, formatMegabytes(m.layout().bytes()))
		r.table([]string{"Rate", ">K", ">goaccel examples/s", ">PyTorch examples/s", ">goaccel / PyTorch",
			">goaccel test accuracy", ">PyTorch test accuracy"}, rows)
		r.unfaithful()
	}
	var banked []string
	for _, rate := range r.res.Network {
		if rate.Emulated && rate.RateBits > 0 && len(rate.Runs) > 0 {
			banked = append(banked, fmt.Sprintf("%s at %s (%s of the rate)", formatMegabytes(rate.BurstBytes),
				rate.rateName(), formatDuration(float64(rate.BurstBytes)*8/float64(rate.RateBits))))
		}
	}
	banked = dedupe(banked) // one line per rate, however many cluster sizes ran at it
	if len(banked) > 0 {
		r.p("A throttled link banks the tokens of the time it is idle, up to its bucket: %s. While the "+
			"processes compute between two syncs the bucket refills, and the next sync spends it at the machine's "+
			"speed: a sync no larger than the bucket, after an idle spell that long, passes unthrottled, as a cable "+
			"would never let it. Both frameworks train on these links alike; the sync times below, taken back to back, "+
			"show the rate itself.\n\n", joinAnd(banked))
	}
}

func (r *reporter) networkSync() {
	rates := r.res.Network
	var rows [][]string
	var bursts []string
	worst := 0.0 // the most the bucket can shorten a sync's median, relative to it
	withPowerSGD := false
	for _, rate := range rates {
		for _, s := range rate.Sync {
			withPowerSGD = withPowerSGD || len(s.PowerSGD.Seconds) > 0
		}
	}
	for _, rate := range rates {
		for _, s := range rate.Sync {
			limit, vsLimit := "—", "—"
			if l := linkLimit(s.Bytes, s.Ranks, rate.RateBits); l > 0 && rate.Emulated {
				limit, vsLimit = formatDuration(l), fmt.Sprintf("%.2f×", s.Bucketed.median()/l)
				if rate.BurstBytes >= s.Bytes {
					bursts = append(bursts, fmt.Sprintf("%s at %s", formatMegabytes(s.Bytes), rate.rateName()))
				}
				// Only a sample's first sync can start on a full bucket.
				for _, v := range []series{s.Bucketed, s.PerTensor, s.BucketedBF16} {
					if v.Iters > 0 && len(v.Seconds) > 0 {
						saved := min(float64(rate.BurstBytes)*8/float64(rate.RateBits), v.median()) / float64(v.Iters)
						worst = max(worst, saved/v.median())
					}
				}
			}
			row := []string{r.where(rate), fmt.Sprintf("%s, %s", s.Model, formatMegabytes(s.Bytes)),
				limit, fmt.Sprintf("%s (%d)", timeCell(s.Bucketed), s.Buckets), fmt.Sprintf("%s (%d)", timeCell(s.PerTensor), s.Tensors),
				timeCell(s.BucketedBF16), vsLimit, fmt.Sprintf("%.2f×", ratio(s.Bucketed, s.PerTensor)),
				fmt.Sprintf("%.2f×", ratio(s.BucketedBF16, s.Bucketed))}
			if withPowerSGD {
				cell := "—"
				if len(s.PowerSGD.Seconds) > 0 {
					cell = timeCell(s.PowerSGD)
				}
				row = append(row, cell)
			}
			rows = append(rows, row)
		}
	}
	if len(rows) == 0 {
		return
	}
	r.p("**Gradient sync alone.** Each model's gradients synced across the hosts by goaccel's Reducer with its " +
		"default plan, by one blocking all-reduce per tensor, and by the Reducer sending bf16 " +
		"(`GOACCEL_GRADIENT_COMPRESSION=bf16`), interleaved as in section 2, syncs timed back to back. The link's " +
		"limit is 2(N−1)/N·S/B: what each host's link must carry each way, at the rate. In parentheses: all-reduces " +
		"per sync.")
	columns := []string{"Rate", "Gradients", ">Link's limit", ">Bucketed", ">Per tensor", ">Bucketed, bf16",
		">Bucketed / limit", ">Per tensor / bucketed", ">bf16 faster by"}
	if withPowerSGD {
		r.p(" *Bucketed, PowerSGD* is the same plan through the PowerSGD hook at rank %d, compressing from the first "+
			"sync: a sync past the start iteration, factors, arithmetic and all.", r.res.Plan.Network.PowerSGDRank)
		columns = append(columns, ">Bucketed, PowerSGD")
	}
	r.p("\n\n")
	r.table(columns, rows)
	r.unfaithful()
	bursts = dedupe(bursts)
	if len(bursts) > 0 {
		r.p("The token bucket holds a whole sync of %s. Timed back to back, only the first sync of a sample can "+
			"start on a full bucket, which shortens any median above by at most %.1f%%.\n\n", joinAnd(bursts),
			100*worst)
	}
}

// networkOverlap bounds what overlapping the last micro-batch's backward with the sync could save: at most
// the backward, which is less than the micro-batch's whole step, and at most the time a step spends not
// computing.
func (r *reporter) networkOverlap() {
	var rows [][]string
	var at []string
	// The sentence quotes the smallest K: a sync after every K-th micro-batch weighs most there.
	smallestK := slices.Min(append([]int{1 << 30}, r.res.Plan.Network.Ks...))
	for _, rate := range r.res.Network {
		for _, m := range r.res.Plan.Network.Models {
			i := slices.IndexFunc(rate.Sync, func(s networkSyncResult) bool { return s.Layout == m.slug() })
			if i < 0 {
				continue
			}
			sync := rate.Sync[i].Bucketed.median()
			for _, run := range rate.Runs {
				if run.Model != m.slug() || run.Impl != "goaccel" || run.mode() != modePlain || len(run.MicroBatchSeconds) == 0 {
					continue
				}
				micro, step := quantile(run.MicroBatchSeconds, 0.5), quantile(run.StepSeconds, 0.5)
				update := 0.0
				if len(run.UpdateSeconds) > 0 {
					update = quantile(run.UpdateSeconds, 0.5)
				}
				idle := max(step-float64(run.K)*micro-update, 0)
				saved := min(micro, idle, sync)
				rows = append(rows, []string{r.where(rate), m.describe(), fmt.Sprint(run.K), formatDuration(micro),
					formatDuration(sync), formatDuration(step), formatDuration(idle),
					fmt.Sprintf("%s (%.0f%%)", formatDuration(saved), 100*saved/step)})
				if run.K == smallestK {
					hosts := ""
					if len(r.res.Plan.Network.hostCounts()) > 1 {
						hosts = fmt.Sprintf(" on %d hosts", rate.procs(r.res.Plan.Network))
					}
					at = append(at, fmt.Sprintf("%s of a %s step for the %s %s%s", formatDuration(saved),
						formatDuration(step), m.describe(), rate.atRate(), hosts))
				}
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	r.p("**What overlap could save.** A sync starts after the last micro-batch's forward and backward; starting "+
		"it during that backward could hide at most the backward, and at most what the step spends not computing "+
		"(the step less K micro-batches and the optimizer's update). The micro-batch's time is rank 0's time in its "+
		"compiled step (forward, backward and accumulation: more than the backward alone), the update's its time "+
		"in the optimizer, both from the demo's summary; the sync is the bucketed sync above. With K=%d, overlap "+
		"could save at most %s. These rows sync after the step, goaccel's default; accel.WithOverlap starts each "+
		"bucket inside it, and [overlap.md](overlap.md) has what that saves.\n\n", smallestK, joinAnd(at))
	r.table([]string{"Rate", "Model", ">K", ">Micro-batch forward + backward", ">Sync alone", ">Time per optimizer step",
		">Step not computing", ">Overlap saves at most"}, rows)
}

// dedupe drops repeated items, keeping the first of each.
func dedupe(items []string) []string {
	var out []string
	for _, s := range items {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// intStrings formats integers.
func intStrings(v []int) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = fmt.Sprint(x)
	}
	return out
}

// joinOr lists alternatives: "2", "2 or 4", "2, 4 or 8".
func joinOr(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// formatMegabytes is a size in decimal megabytes, as link rates count: "3.25 MB".
func formatMegabytes(n int64) string { return fmt.Sprintf("%.2f MB", float64(n)/1e6) }

// joinAnd lists items: "a", "a and b", "a, b and c".
func joinAnd(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}
