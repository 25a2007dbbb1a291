package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/netcluster"
)

// networkPlan is section 6: the demo's job against PyTorch DDP and the gradient syncs alone, with one
// process and one compute thread per host, on hosts joined by a network: an emulated cluster that the
// driver builds once per link rate (root), or the hosts of -hosts, as their network is.
type networkPlan struct {
	Rates []int64 // bit/s of every host's link, 0 unthrottled; none: skip the section
	Hosts int     // of the emulated cluster
	// HostCounts, when set, are the sizes of the emulated clusters instead of Hosts: every rate on each.
	HostCounts []int `json:",omitempty"`
	// Modes are what the end-to-end runs exchange (networkModes; none: plain only), PowerSGD's rank and
	// start iteration and the local steps H of local SGD and DiLoCo what the modes take.
	Modes                       []string `json:",omitempty"`
	PowerSGDRank, PowerSGDStart int      `json:",omitempty"`
	LocalSteps                  int      `json:",omitempty"`
	// AlphaBetaSizes are the float32 all-reduces timed alone at each rate, from which the α-β model fits the
	// link's latency and inverse bandwidth (none: no fit).
	AlphaBetaSizes []int64 `json:",omitempty"`
	// The end-to-end runs: every model, K and implementation, Rounds times each, interleaved.
	Models        []networkModel
	Ks            []int
	Batch, Epochs int
	LR            float64
	Seed          int
	Rounds        int
	// Impls are what trains end to end (nil: networkImpls): -network-overlap compares goaccel's sync after
	// the step with the one that overlaps the backward pass ("goaccel+overlap").
	Impls []string
	// Syncs are the gradients whose sync is measured alone; SyncTiming how.
	Syncs      []gradientLayout
	SyncTiming timing
	// LinkCheck is how long the TCP stream that checks each emulated link's rate lasts.
	LinkCheck time.Duration
}

// networkModel is one of the demo's models with its hidden width, trained on the first Limit examples.
type networkModel struct {
	Name   string // "mlp" or "cnn"
	Hidden int
	Limit  int
}

// slug names the model in benchmark names and ties its runs to its gradients' sync: "mlp-1024", "cnn".
func (m networkModel) slug() string {
	if m.Name == "cnn" {
		return "cnn-" + strconv.Itoa(m.Hidden)
	}
	return m.Name + "-" + strconv.Itoa(m.Hidden)
}

// layout is the model's gradients as the demo's model registers them.
func (m networkModel) layout() gradientLayout {
	if m.Name == "cnn" {
		return demoCNNLayout(m.Hidden)
	}
	l := mlp{Inputs: 784, Hidden: []int{m.Hidden}, Classes: 10}.layout()
	l.Slug = m.slug()
	return l
}

// describe is the model for people: "MLP 784→1024→10", "CNN (hidden 128)".
func (m networkModel) describe() string {
	if m.Name == "cnn" {
		return fmt.Sprintf("CNN (dense hidden layer of %d)", m.Hidden)
	}
	return mlp{Inputs: 784, Hidden: []int{m.Hidden}, Classes: 10}.shortName()
}

// gradientLayout is a model's float32 gradient tensors, by shape, in registration order: what its sync
// moves, and all that the bucket plan depends on.
type gradientLayout struct {
	Slug, Name string
	Shapes     [][]int
}

func (l gradientLayout) params() []accumulate.Param {
	var params []accumulate.Param
	for i, dims := range l.Shapes {
		params = append(params, accumulate.Param{Name: fmt.Sprintf("/p%03d", i), Shape: float32Shape(dims)})
	}
	return params
}

// float32Shape is a float32 tensor's shape.
func float32Shape(dims []int) shapes.Shape { return shapes.Make(dtypes.Float32, dims...) }

func (l gradientLayout) bytes() int64 { return paramBytes(l.params()) }

// layout is the MLP's gradients.
func (m mlp) layout() gradientLayout {
	l := gradientLayout{Slug: "mlp", Name: m.shortName()}
	for _, p := range m.params() {
		l.Shapes = append(l.Shapes, p.Shape.Dimensions)
	}
	return l
}

// demoCNNLayout is the grad_accum demo's CNN: two 3×3 convolutions (16 and 32 filters, with biases) on
// 28×28×1 images, each pooled 2×2, then a dense hidden layer and the 10 logits.
func demoCNNLayout(hidden int) gradientLayout {
	return gradientLayout{Slug: "cnn-" + strconv.Itoa(hidden), Name: fmt.Sprintf("CNN (dense hidden layer of %d)", hidden),
		Shapes: [][]int{{3, 3, 1, 16}, {16}, {3, 3, 16, 32}, {32}, {7 * 7 * 32, hidden}, {hidden}, {hidden, 10}, {10}}}
}

// networkResult is section 6 at one link rate.
type networkResult struct {
	// RateBits is every host link's rate limit, bit/s: 0 unthrottled, or the -hosts' network as it is.
	RateBits   int64
	BurstBytes int64 // the token bucket of the limiter (0: none)
	Emulated   bool
	Hosts      string
	// LinkBits is the goodput of one TCP stream from host 0 to host 1 in bit/s, measured before anything
	// else at this rate (0: not measured, on -hosts).
	LinkBits float64
	Sync     []networkSyncResult
	Runs     []networkRun
	// Procs is the number of hosts, one process each (0 in results saved before it was recorded: the plan's
	// Hosts).
	Procs int `json:",omitempty"`
	// AllReduce are the plan's AlphaBetaSizes all-reduced alone, back to back.
	AllReduce []sizedSeries `json:",omitempty"`
}

// sizedSeries is one all-reduce size and its times.
type sizedSeries struct {
	Bytes int64
	Time  series
}

// networkSyncResult is one model's gradient sync across the hosts.
type networkSyncResult struct {
	Ranks   int
	Layout  string // the gradientLayout's slug
	Model   string
	Tensors int
	Bytes   int64
	Buckets int // of the default plan
	// Bucketed is accumulate.Reducer.Sync with the default plan, PerTensor one blocking all-reduce per
	// tensor after another, BucketedBF16 the default plan sent as bfloat16 (accumulate.NewCompressionHook).
	Bucketed, PerTensor, BucketedBF16 series
	// PowerSGD is the default plan through accumulate's PowerSGD hook, compressing from the first sync, at
	// the plan's rank (none when the plan has no PowerSGD mode).
	PowerSGD series `json:",omitempty"`
}

// networkRun is one end-to-end variant at one rate: an implementation, a model and K, one entry per run.
type networkRun struct {
	Impl, Model string // "goaccel" or "pytorch"; the networkModel's slug
	// Mode is what the processes exchange, one of networkModes ("" is plain: every gradient every step).
	Mode         string `json:",omitempty"`
	K            int
	PerExample   series
	TestAccuracy []float64
	StepSeconds  []float64 // training time per optimizer step
	// Steps are the optimizer steps of each run.
	Steps []int64
	// MicroBatchSeconds (goaccel) is rank 0's time in a micro-batch's compiled step (forward, backward and
	// the accumulation into the buckets): the demo's micro-batch compute time over its micro-batches; and
	// UpdateSeconds its time in the optimizer's update, per optimizer step.
	MicroBatchSeconds []float64 `json:",omitempty"`
	UpdateSeconds     []float64 `json:",omitempty"`
	// WaitSeconds (goaccel) is rank 0's time waiting for collectives per optimizer step, and
	// OverlappedBuckets the buckets its steps started from inside themselves (accel.WithOverlap).
	WaitSeconds       []float64 `json:",omitempty"`
	OverlappedBuckets []int64   `json:",omitempty"`
	// OverlapDoneInStep are those whose all-reduce completed inside their step, OverlapInStepSeconds the
	// time they had there per bucket.
	OverlapDoneInStep    []int64   `json:",omitempty"`
	OverlapInStepSeconds []float64 `json:",omitempty"`
	// SentBytes is what host 0's link sent during the run (emulated clusters).
	SentBytes []uint64 `json:",omitempty"`
	// CollectiveBytes is what rank 0 handed to all-reduces while training: goaccel's summary's
	// collective_bytes, PyTorch's count of the bytes its comm hooks and model averager all-reduce.
	CollectiveBytes []int64 `json:",omitempty"`
}

// The modes of the end-to-end runs: what goaccel's demo and PyTorch's script exchange, and how each is asked
// for. PyTorch has no DiLoCo.
const (
	modePlain    = "plain"
	modeBF16     = "bf16"
	modePowerSGD = "powersgd"
	modeLocalSGD = "localsgd"
	modeDiLoCo   = "diloco"
)

// mode is the run's mode, plain when unset.
func (r networkRun) mode() string {
	if r.Mode == "" {
		return modePlain
	}
	return r.Mode
}

// hostCounts are the sizes of the emulated clusters the plan measures on.
func (p networkPlan) hostCounts() []int {
	if len(p.HostCounts) > 0 {
		return p.HostCounts
	}
	return []int{p.Hosts}
}

// modes are the plan's modes, plain alone when none is named.
func (p networkPlan) modes() []string {
	if len(p.Modes) > 0 {
		return p.Modes
	}
	return []string{modePlain}
}

// goaccelMode is how the demo is asked for a mode: its flags and the environment of the job.
func (p networkPlan) goaccelMode(mode string) (args, env []string) {
	switch mode {
	case modeBF16:
		return nil, []string{"GOACCEL_GRADIENT_COMPRESSION=bf16"}
	case modePowerSGD:
		return nil, []string{fmt.Sprintf("GOACCEL_POWERSGD=%d:%d", p.PowerSGDRank, p.PowerSGDStart)}
	case modeLocalSGD:
		return []string{"-local-sgd", strconv.Itoa(p.LocalSteps)}, nil
	case modeDiLoCo:
		return []string{"-diloco", strconv.Itoa(p.LocalSteps)}, nil
	}
	return nil, nil
}

// pytorchMode is how fashion_ddp.py is asked for a mode; ok is false where PyTorch has none. Its torch
// (1.13) refuses bf16_compress_hook without CUDA and NCCL, so bf16's counterpart is fp16_compress_hook: the
// same two bytes per element on the wire.
func (p networkPlan) pytorchMode(mode string) (args []string, ok bool) {
	switch mode {
	case modePlain:
		return nil, true
	case modeBF16:
		return []string{"--comm-hook", "fp16"}, true
	case modePowerSGD:
		return []string{"--comm-hook", "powersgd", "--powersgd-rank", strconv.Itoa(p.PowerSGDRank), "--powersgd-start",
			strconv.Itoa(p.PowerSGDStart)}, true
	case modeLocalSGD:
		return []string{"--comm-hook", "postlocal", "--local-period", strconv.Itoa(p.LocalSteps)}, true
	}
	return nil, false
}

// networkSyncJob is what the ranks of a network rank job measure.
type networkSyncJob struct {
	Layouts []gradientLayout
	Timing  timing
	Label   string // the rate, in benchmark names
	// PowerSGDRank, when set, also times each layout's sync through the PowerSGD hook at that rank.
	PowerSGDRank int `json:",omitempty"`
	// AllReduceSizes are float32 all-reduces timed alone, for the α-β fit.
	AllReduceSizes []int64 `json:",omitempty"`
}

// rateLabel names a rate in benchmark names and tables: "1Gbit", "10Gbit", "unthrottled", or "hosts" for
// the -hosts' network.
func rateLabel(bits int64, emulated bool) string {
	switch {
	case !emulated:
		return "hosts"
	case bits == 0:
		return "unthrottled"
	case bits%1_000_000_000 == 0:
		return fmt.Sprintf("%dGbit", bits/1_000_000_000)
	}
	return fmt.Sprintf("%dMbit", bits/1_000_000)
}

// rateName is a rate for people: "1 Gbit/s", "unthrottled", "the hosts' network".
func (r networkResult) rateName() string {
	switch {
	case !r.Emulated:
		return "the hosts' network"
	case r.RateBits == 0:
		return "unthrottled"
	}
	return formatBits(float64(r.RateBits))
}

// atRate is the rate in a sentence: "at 1 Gbit/s", "unthrottled", "on the hosts' network".
func (r networkResult) atRate() string {
	if !r.Emulated {
		return "on " + r.rateName()
	}
	if r.RateBits == 0 {
		return r.rateName()
	}
	return "at " + r.rateName()
}

// formatBits is a bit rate: "1 Gbit/s", "940 Mbit/s", "2.31 Gbit/s".
func formatBits(bits float64) string {
	switch {
	case bits >= 1e9 && bits == float64(int64(bits/1e9))*1e9:
		return fmt.Sprintf("%.0f Gbit/s", bits/1e9)
	case bits >= 1e9:
		return fmt.Sprintf("%.2f Gbit/s", bits/1e9)
	}
	return fmt.Sprintf("%.0f Mbit/s", bits/1e6)
}

// linkLimit is the shortest time an all-reduce of the layout's bytes can take across n ranks, one per host,
// on links of rateBits: each host's link carries 2(n−1)/n times the bytes each way. 0 without a rate.
func linkLimit(bytes int64, ranks int, rateBits int64) float64 {
	if rateBits <= 0 || ranks < 2 {
		return 0
	}
	return busFactor(ranks) * float64(bytes) * 8 / float64(rateBits)
}

var networkImpls = []string{"goaccel", "pytorch"}

// clustersAvailable says whether emulated clusters can be built here (netcluster.Available; tests replace
// it).
var clustersAvailable = netcluster.Available

// measureNetwork runs section 6: at every rate of the plan on an emulated cluster built for it, or once on
// the -hosts. Without the means to build a cluster it measures nothing and says why.
func (d *driver) measureNetwork(ctx context.Context) (_ []networkResult, skipped string, _ error) {
	p := d.plan.Network
	if len(p.Rates) == 0 {
		return nil, "", nil
	}
	if d.hosts != nil {
		hosts := d.hosts.onePerHost()
		d.progressf("network: on %s\n", hosts.describe())
		r, err := d.measureNetworkOn(ctx, hosts, networkResult{Hosts: hosts.describe(), Procs: len(hosts.hosts)})
		return []networkResult{r}, "", err
	}
	if err := clustersAvailable(); err != nil {
		d.progressf("network: not measured: %v\n", err)
		return nil, err.Error(), nil
	}
	if err := netcluster.Sweep(); err != nil {
		d.progressf("network: removing what killed runs left behind: %v\n", err)
	}
	var out []networkResult
	for _, n := range p.hostCounts() {
		for _, rate := range p.Rates {
			c, err := netcluster.New(n, netcluster.WithRate(rate))
			if err != nil {
				return nil, "", err
			}
			hosts := emulatedHostSet(c)
			res := networkResult{RateBits: rate, BurstBytes: c.BurstBytes, Emulated: true, Hosts: hosts.describe(), Procs: n}
			d.progressf("network: %d hosts, %s, emulated cluster %s\n", n, res.rateName(), c.ID)
			r, err := d.measureNetworkOn(ctx, hosts, res)
			if closeErr := c.Close(); err == nil {
				err = closeErr
			}
			if err != nil {
				return nil, "", fmt.Errorf("network, %d hosts, %s: %w", n, res.rateName(), err)
			}
			out = append(out, r)
		}
	}
	return out, "", nil
}

// measureNetworkOn measures at one rate: the link first (emulated clusters), then the syncs alone, then
// the end-to-end runs.
func (d *driver) measureNetworkOn(ctx context.Context, hosts *hostSet, res networkResult) (networkResult, error) {
	p := d.plan.Network
	if c := hosts.cluster; c != nil {
		bits, err := measureLink(ctx, c, p.LinkCheck)
		if err != nil {
			return res, err
		}
		res.LinkBits = bits
		d.progressf("network: %s: one TCP stream from host 0 to host 1 carries %s\n", res.rateName(), formatBits(bits))
		if err := checkLimiter(res); err != nil {
			return res, err
		}
	}
	label := rateLabel(res.RateBits, res.Emulated)
	job := rankJob{Plan: d.plan, Network: &networkSyncJob{Layouts: p.Syncs, Timing: p.SyncTiming, Label: label,
		AllReduceSizes: p.AlphaBetaSizes}}
	if slices.Contains(p.Modes, modePowerSGD) {
		job.Network.PowerSGDRank = p.PowerSGDRank
	}
	r, err := d.runRanks(ctx, len(hosts.hosts), hosts, job)
	if err != nil {
		return res, err
	}
	res.Sync, res.AllReduce = r.NetworkSync, r.NetworkAllReduce
	for _, s := range res.Sync {
		d.emit(s.Bucketed, s.PerTensor, s.BucketedBF16)
		if len(s.PowerSGD.Seconds) > 0 {
			d.emit(s.PowerSGD)
		}
	}
	for _, a := range res.AllReduce {
		d.emit(a.Time)
	}
	if res.Runs, err = d.networkEndToEnd(ctx, hosts, label); err != nil {
		return res, err
	}
	return res, nil
}

// limiterSlack is how far above its rate a throttled link's measured goodput may be before the limiter
// counts as off: the token bucket lets a burst through at the start, which the measurement mostly skips.
const limiterSlack = 1.1

// checkLimiter refuses to measure at a rate whose link carried more than the rate: a limiter that is not on
// would make every figure of the rate a lie.
func checkLimiter(res networkResult) error {
	if res.RateBits > 0 && res.LinkBits > limiterSlack*float64(res.RateBits) {
		return fmt.Errorf("the links were limited to %s, but one TCP stream carried %s: the limiter is not on",
			formatBits(float64(res.RateBits)), formatBits(res.LinkBits))
	}
	return nil
}

// measureLink sends one TCP stream from host 0 to host 1 of c for about d and returns its goodput in bit/s,
// as the receiver saw it after the first fifth of the time: the limiter's token bucket starts full and lets
// a burst through at the link's own speed first.
func measureLink(ctx context.Context, c *netcluster.Cluster, d time.Duration) (float64, error) {
	if len(c.Hosts) < 2 {
		return 0, errors.New("network: the link check needs two hosts")
	}
	l, err := c.Listen(1, "tcp", netip.AddrPortFrom(c.Hosts[1].Addr, 0).String())
	if err != nil {
		return 0, err
	}
	defer l.Close()
	type received struct {
		bits float64
		err  error
	}
	done := make(chan received, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			done <- received{err: err}
			return
		}
		defer conn.Close()
		buf := make([]byte, 1<<20)
		var total, atMark int64
		var start, mark time.Time
		for {
			n, err := conn.Read(buf)
			now := time.Now()
			if total == 0 && n > 0 {
				start = now
			}
			total += int64(n)
			if mark.IsZero() && !start.IsZero() && now.Sub(start) >= d/5 {
				mark, atMark = now, total
			}
			if errors.Is(err, io.EOF) {
				if mark.IsZero() || !now.After(mark) {
					done <- received{err: fmt.Errorf("network: the link check's stream ended after %s", now.Sub(start))}
					return
				}
				done <- received{bits: float64(total-atMark) * 8 / now.Sub(mark).Seconds()}
				return
			}
			if err != nil {
				done <- received{err: err}
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	conn, err := c.DialContext(ctx, 0, "tcp", l.Addr().String())
	if err != nil {
		return 0, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	buf := make([]byte, 1<<20)
	for start := time.Now(); time.Since(start) < d; {
		if _, err := conn.Write(buf); err != nil {
			_ = conn.Close()
			return 0, fmt.Errorf("network: the link check's stream: %w", err)
		}
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, err
	}
	r := <-done
	_ = conn.Close()
	return r.bits, r.err
}

// measureNetworkSync times each layout's gradient sync across the ranks: the Reducer with the default
// plan, plain and sending bf16, and one blocking all-reduce per tensor. Collective.
func measureNetworkSync(comm *backends.Communicator, barrier func() error, job networkSyncJob) ([]networkSyncResult, error) {
	hook, err := accumulate.NewCompressionHook(accumulate.BF16)
	if err != nil {
		return nil, err
	}
	var out []networkSyncResult
	for _, l := range job.Layouts {
		params := l.params()
		res := networkSyncResult{Ranks: comm.Size(), Layout: l.Slug, Model: l.Name, Tensors: len(params), Bytes: l.bytes()}
		bucketed, err := newBucketSet(params, 0, defaultBucketCapBytes)
		if err != nil {
			return nil, err
		}
		compressed, err := newBucketSet(params, 0, defaultBucketCapBytes)
		if err != nil {
			return nil, err
		}
		perTensor, err := newBucketSet(params, 1, 1)
		if err != nil {
			return nil, err
		}
		res.Buckets = len(bucketed.plan.Buckets)
		name := func(v string) string {
			return fmt.Sprintf("NetworkSync/model=%s/%s/rate=%s/ranks=%d", l.Slug, v, job.Label, comm.Size())
		}
		variants := []variant{{name("bucketed"), reducerLoop(comm, bucketed)},
			{name("per-tensor"), sequentialLoop(comm, perTensor)},
			{name("bucketed-bf16"), reducerLoop(comm, compressed, accumulate.WithCommHook(hook))}}
		if job.PowerSGDRank > 0 {
			// Compressing from the first sync: the time of a sync once training is past the start iteration.
			psgd, err := accumulate.NewPowerSGDHook(accumulate.PowerSGDConfig{Rank: job.PowerSGDRank})
			if err != nil {
				return nil, err
			}
			set, err := newBucketSet(params, 0, defaultBucketCapBytes)
			if err != nil {
				return nil, err
			}
			variants = append(variants, variant{name("bucketed-powersgd"), reducerLoop(comm, set, accumulate.WithCommHook(psgd))})
		}
		s, err := group{comm: comm, barrier: barrier, timing: job.Timing}.measure(variants...)
		if err != nil {
			return nil, fmt.Errorf("network sync of %s: %w", l.Name, err)
		}
		for i := range s {
			s[i].Bytes = res.Bytes
		}
		res.Bucketed, res.PerTensor, res.BucketedBF16 = s[0], s[1], s[2]
		if len(s) > 3 {
			res.PowerSGD = s[3]
		}
		out = append(out, res)
	}
	return out, nil
}

// measureNetworkAllReduce times float32 all-reduces of each size alone, back to back: the points the α-β
// model's fit of the link goes through. Collective.
func measureNetworkAllReduce(comm *backends.Communicator, barrier func() error, job networkSyncJob) ([]sizedSeries, error) {
	var out []sizedSeries
	for _, size := range job.AllReduceSizes {
		buf := make([]float32, size/4)
		s, err := group{comm: comm, barrier: barrier, timing: job.Timing}.measure(variant{
			fmt.Sprintf("NetworkAllReduce/size=%s/rate=%s/ranks=%d", formatBytes(size), job.Label, comm.Size()),
			func(iters int) error {
				for range iters {
					if err := comm.AllReduceSum(backends.BufferOf(buf)); err != nil {
						return err
					}
				}
				return nil
			}})
		if err != nil {
			return nil, fmt.Errorf("all-reduce of %s: %w", formatBytes(size), err)
		}
		s[0].Bytes = size
		out = append(out, sizedSeries{Bytes: size, Time: s[0]})
	}
	return out, nil
}

// networkEndToEnd trains every model at every K with goaccel and PyTorch across the hosts, Rounds times
// each, in an order that changes from round to round.
func (d *driver) networkEndToEnd(ctx context.Context, hosts *hostSet, label string) ([]networkRun, error) {
	p := d.plan.Network
	type variant struct {
		model networkModel
		run   networkRun
	}
	var variants []variant
	for _, m := range p.Models {
		for _, k := range p.Ks {
			impls := p.Impls
			if impls == nil {
				impls = networkImpls
			}
			for _, mode := range p.modes() {
				for _, impl := range impls {
					if _, ok := p.pytorchMode(mode); impl == "pytorch" && !ok {
						continue
					}
					if impl == "goaccel+overlap" && mode != modePlain {
						continue // overlap is compared on the plain sync alone
					}
					name := fmt.Sprintf("NetworkEndToEnd/model=%s/impl=%s/k=%d/rate=%s/procs=%d", m.slug(), impl, k, label,
						len(hosts.hosts))
					run := networkRun{Impl: impl, Model: m.slug(), K: k}
					if mode != modePlain {
						// Plain runs keep the names of results saved before there were modes.
						run.Mode = mode
						name = strings.Replace(name, "/k=", "/mode="+mode+"/k=", 1)
					}
					run.PerExample = series{Name: name}
					variants = append(variants, variant{m, run})
				}
			}
		}
	}
	for round := range p.Rounds {
		for _, i := range rand.New(rand.NewPCG(uint64(round), 0x6e7)).Perm(len(variants)) {
			v := &variants[i]
			d.progressf("network: %d hosts, %s, %s, K=%d, %s, %s (round %d of %d)\n", len(hosts.hosts), label,
				v.model.describe(), v.run.K, v.run.mode(), v.run.Impl, round+1, p.Rounds)
			var before netcluster.LinkStats
			if c := hosts.cluster; c != nil {
				var err error
				if before, err = c.LinkStats(0); err != nil {
					return nil, err
				}
			}
			s, err := d.trainOnNetwork(ctx, hosts, v.run.Impl, v.model, v.run.K, v.run.mode())
			if err == nil && !(s.ExamplesPerSecond > 0 && s.OptimizerSteps > 0) {
				err = errors.New("its summary line reports no examples_per_second or optimizer_steps")
			}
			if err != nil {
				return nil, fmt.Errorf("%s with %s, K=%d, %s: %w", v.model.describe(), v.run.Impl, v.run.K, v.run.mode(), err)
			}
			r := &v.run
			r.PerExample.Iters = s.TrainExamples * s.Epochs
			r.PerExample.Seconds = append(r.PerExample.Seconds, 1/s.ExamplesPerSecond)
			r.TestAccuracy = append(r.TestAccuracy, s.TestAccuracy)
			r.StepSeconds = append(r.StepSeconds, s.TrainSeconds/float64(s.OptimizerSteps))
			r.Steps = append(r.Steps, s.OptimizerSteps)
			r.CollectiveBytes = append(r.CollectiveBytes, s.CollectiveBytes)
			if strings.HasPrefix(v.run.Impl, "goaccel") && s.MicroBatches > 0 {
				r.MicroBatchSeconds = append(r.MicroBatchSeconds, s.MicroBatchComputeSeconds/float64(s.MicroBatches))
				r.UpdateSeconds = append(r.UpdateSeconds, (s.ComputeSeconds-s.MicroBatchComputeSeconds)/float64(s.OptimizerSteps))
				r.WaitSeconds = append(r.WaitSeconds, s.CommWaitSeconds/float64(s.OptimizerSteps))
				r.OverlappedBuckets = append(r.OverlappedBuckets, s.OverlappedBuckets)
				if s.OverlappedBuckets > 0 {
					r.OverlapDoneInStep = append(r.OverlapDoneInStep, s.OverlapDoneInStep)
					r.OverlapInStepSeconds = append(r.OverlapInStepSeconds, s.OverlapInStepSeconds/float64(s.OverlappedBuckets))
				}
			}
			if c := hosts.cluster; c != nil {
				after, err := c.LinkStats(0)
				if err != nil {
					return nil, err
				}
				r.SentBytes = append(r.SentBytes, after.TxBytes-before.TxBytes)
			}
		}
	}
	var out []networkRun
	for _, v := range variants {
		d.emit(v.run.PerExample)
		out = append(out, v.run)
	}
	return out, nil
}

// networkSummary is what section 6 reads from the summary lines of the demo and of the PyTorch script.
type networkSummary struct {
	runSummary
	TrainSeconds             float64 `json:"train_seconds"`
	OptimizerSteps           int64   `json:"optimizer_steps"`
	MicroBatches             int64   `json:"micro_batches"`
	ComputeSeconds           float64 `json:"compute_seconds"`
	MicroBatchComputeSeconds float64 `json:"micro_batch_compute_seconds"`
	CollectiveBytes          int64   `json:"collective_bytes"`
	CommWaitSeconds          float64 `json:"comm_wait_seconds"`
	OverlappedBuckets        int64   `json:"overlapped_buckets"`
	OverlapDoneInStep        int64   `json:"overlap_done_in_step"`
	OverlapInStepSeconds     float64 `json:"overlap_in_step_seconds"`
}

// trainOnNetwork trains once across the hosts, one process each with one compute thread, and returns
// rank 0's summary.
func (d *driver) trainOnNetwork(ctx context.Context, hosts *hostSet, impl string, m networkModel, k int, mode string) (networkSummary, error) {
	p, s := d.plan.Network, d.endToEnd
	ctx, cancel := context.WithTimeout(ctx, d.plan.JobTimeout)
	defer cancel()
	job := func(dash string) []string {
		return []string{dash + "model", m.Name, dash + "hidden", strconv.Itoa(m.Hidden), dash + "epochs",
			strconv.Itoa(p.Epochs), dash + "batch", strconv.Itoa(p.Batch), dash + "k", strconv.Itoa(k), dash + "lr",
			fmt.Sprint(p.LR), dash + "seed", strconv.Itoa(p.Seed), dash + "limit", strconv.Itoa(m.Limit), dash + "data",
			s.dataDir}
	}
	var summary networkSummary
	n := len(hosts.hosts)
	if strings.HasPrefix(impl, "goaccel") {
		args, env := p.goaccelMode(mode)
		env = append([]string{cpu.ThreadsEnvVar + "=1"}, env...)
		if p.Impls != nil {
			// Comparing the two syncs: each run says which it measures.
			env = append(env, accel.OverlapEnvVar+"="+strconv.FormatBool(impl == "goaccel+overlap"))
		}
		cmd, err := hosts.mpirun(ctx, n, s.demo, append(append(job("-"), args...), "-quiet"), jobEnv(env...))
		if err != nil {
			return summary, err
		}
		return summary, d.runForSummary(cmd, &summary)
	}
	// One PyTorch process per host, started through the launch agent with the script on its standard
	// input: nothing needs to be installed on the hosts but Python with PyTorch and the data.
	port := strconv.Itoa(20000 + rand.IntN(20000))
	ctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	cmds := make([]*exec.Cmd, n)
	var rank0 bytes.Buffer
	for i := range n {
		argv := append([]string{s.python, "-", "--rank", strconv.Itoa(i), "--world", strconv.Itoa(n), "--master-addr",
			hosts.masterAddr, "--master-port", port, "--threads", "1"}, hosts.glooNetwork...)
		modeArgs, _ := p.pytorchMode(mode)
		cmds[i] = hosts.onHost(ctx, i, append(append(argv, job("--")...), modeArgs...))
		cmds[i].Stdin, cmds[i].Stdout, cmds[i].Stderr = bytes.NewReader(pytorchScript), io.Discard, d.progress
		if i == 0 {
			cmds[i].Stdout = &rank0
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			errs[i] = err
			stopAll()
			break
		}
		wg.Go(func() {
			if err := cmd.Wait(); err != nil {
				errs[i] = fmt.Errorf("rank %d (%s): %w", i, launch.String(cmd.Args), err)
				stopAll() // the others would wait for it until gloo's timeout
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return summary, err
	}
	out := bytes.TrimSpace(rank0.Bytes())
	if err := json.Unmarshal(out[bytes.LastIndexByte(out, '\n')+1:], &summary); err != nil {
		return summary, fmt.Errorf("PyTorch's rank 0: the last line of its output is no JSON summary: %w\n%s", err,
			lastLines(string(out), 5))
	}
	return summary, nil
}
