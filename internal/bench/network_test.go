package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/netcluster"
)

// standIns are stand-in programs for the network section's plumbing: an mpirun that logs its command line
// and prints what the demo or rank 0 of a rank job would, a launch agent that logs the host and runs the
// command here, and a Python that logs its arguments and the first line of its standard input.
type standIns struct {
	dir, mpirun, agent, python, demo string
}

func newStandIns(t *testing.T, syncs []networkSyncResult, python string) standIns {
	t.Helper()
	dir := t.TempDir()
	line, err := json.Marshal(results{NetworkSync: syncs})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "results"), append([]byte(resultsLinePrefix), line...), 0o644))
	s := standIns{dir: dir, demo: filepath.Join(dir, "grad_accum")}
	write := func(name, script string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"+script+"\n"), 0o755))
		return path
	}
	s.mpirun = write("mpirun", `echo "GOACCEL_BLAS_THREADS=$GOACCEL_BLAS_THREADS $*" >> `+dir+`/mpirun.log
case " $* " in
*" -rank-job "*) cat `+dir+`/results; echo ;;
*) echo "a progress line"
   echo '{"train_examples":512,"epochs":1,"examples_per_second":2000,"test_accuracy":0.5,"train_seconds":0.256,`+
		`"optimizer_steps":2,"micro_batches":4,"compute_seconds":0.05,"micro_batch_compute_seconds":0.04}' ;;
esac`)
	s.agent = write("agent", `echo "$*" >> `+dir+`/agent.log
shift
exec /bin/sh -c "$*"`)
	s.python = write("python", python)
	return s
}

// pythonLogging is a stand-in Python for newStandIns: it logs the first line of the script it was given on
// standard input and its arguments, and rank 0 prints a summary.
func pythonLogging(dir string) string {
	return `script=$(mktemp); cat > "$script"; echo "$(head -n 1 "$script") | $*" >> ` + dir + `/python.log; rm "$script"
case " $* " in
*" --rank 0 "*) echo '{"train_examples":512,"epochs":1,"examples_per_second":1000,"test_accuracy":0.4,"train_seconds":0.512,"optimizer_steps":2}' ;;
esac`
}

// plumbingDriver is a driver whose network section runs across the hosts h0 and h1 with the stand-ins.
func plumbingDriver(t *testing.T, s standIns) (*driver, *bytes.Buffer) {
	t.Helper()
	hosts, err := parseHostSet("h0:2,h1:2", s.agent, "10.9.0.0/24")
	require.NoError(t, err)
	hosts.launchOptions = []launch.Option{launch.WithMPIRun(s.mpirun), launch.WithFlavor(launch.OpenMPI)}
	p := quickPlan()
	require.NoError(t, p.only("network"))
	var benchstat bytes.Buffer
	return &driver{plan: p, exe: "/opt/accelbench", progress: &bytes.Buffer{}, benchstat: &benchstat, hosts: hosts,
		endToEnd: endToEndSetup{demo: s.demo, python: s.python, dataDir: "/data/fashion"}}, &benchstat
}

// logLines reads a stand-in's log.
func logLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// TestNetworkPlumbing drives the network section across two hosts with stand-in programs: the sync job and
// the demo start through mpirun lines that package launch builds for the hosts (agent, network, the
// compute thread forwarded), one PyTorch process per host starts through the agent with its rank, the
// master's address, gloo's network and the script on its standard input, and the summaries and rank 0's
// results land in the section's results and report.
func TestNetworkPlumbing(t *testing.T) {
	sync := networkSyncResult{Ranks: 2, Layout: "mlp-32", Model: "MLP 784→32→10", Tensors: 4, Bytes: 101800, Buckets: 1,
		Bucketed: constant("b", 0.001), PerTensor: constant("p", 0.002), BucketedBF16: constant("c", 0.0005)}
	dir := t.TempDir()
	s := newStandIns(t, []networkSyncResult{sync}, pythonLogging(dir))
	d, benchstat := plumbingDriver(t, s)
	out, skipped, err := d.measureNetwork(context.Background())
	require.NoError(t, err)
	assert.Empty(t, skipped)

	require.Len(t, out, 1, "the hosts' network, as it is: one rate")
	res := out[0]
	assert.False(t, res.Emulated)
	assert.Equal(t, "h0:1, h1:1", res.Hosts, "one process per host, whatever their slots")
	assert.Zero(t, res.LinkBits, "no link check on hosts accelbench did not build")
	assert.Equal(t, []networkSyncResult{sync}, res.Sync)
	require.Len(t, res.Runs, 2)
	for _, r := range res.Runs {
		assert.Equal(t, "mlp-32", r.Model)
		assert.Equal(t, 2, r.K)
		assert.Equal(t, 512, r.PerExample.Iters)
		assert.Equal(t, []int64{2}, r.Steps)
		switch r.Impl {
		case "goaccel":
			assert.Equal(t, []float64{1.0 / 2000}, r.PerExample.Seconds)
			assert.Equal(t, []float64{0.128}, r.StepSeconds)
			assert.InDeltaSlice(t, []float64{0.01}, r.MicroBatchSeconds, 1e-12, "0.04 s over 4 micro-batches")
			assert.InDeltaSlice(t, []float64{0.005}, r.UpdateSeconds, 1e-12, "(0.05 − 0.04) s over 2 steps")
		case "pytorch":
			assert.Equal(t, []float64{1.0 / 1000}, r.PerExample.Seconds)
			assert.Empty(t, r.MicroBatchSeconds)
		}
	}

	calls := logLines(t, filepath.Join(s.dir, "mpirun.log"))
	require.Len(t, calls, 2, "the sync job, then the demo")
	for _, call := range calls {
		assert.Contains(t, call, " -np 2 --host h0:1,h1:1 ")
		assert.Contains(t, call, " --mca plm_rsh_agent "+s.agent+
			" --mca btl_tcp_if_include 10.9.0.0/24 --mca oob_tcp_if_include 10.9.0.0/24 ")
		assert.NotContains(t, call, "--oversubscribe", "on hosts the slots decide")
	}
	assert.Contains(t, calls[0], " /opt/accelbench -rank-job {")
	assert.Contains(t, calls[0], `"Network":{"Layouts":[{"Slug":"mlp-32"`)
	assert.True(t, strings.HasPrefix(calls[1], "GOACCEL_BLAS_THREADS=1 "), "one compute thread: %s", calls[1])
	assert.Contains(t, calls[1], " -x GOACCEL_BLAS_THREADS ", "forwarded to the other host")
	assert.True(t, strings.HasSuffix(calls[1], s.demo+" -model mlp -hidden 32 -epochs 1 -batch 64 -k 2 -lr 0.002 -seed 42 "+
		"-limit 512 -data /data/fashion -quiet"), calls[1])

	agent := logLines(t, filepath.Join(s.dir, "agent.log"))
	python := logLines(t, filepath.Join(dir, "python.log"))
	require.Len(t, agent, 2)
	require.Len(t, python, 2)
	for rank, host := range []string{"h0", "h1"} {
		i := 0
		if !strings.HasPrefix(agent[0], host+" ") {
			i = 1
		}
		assert.Regexp(t, `^`+host+` exec `+s.python+` - --rank `+string(rune('0'+rank))+` --world 2 --master-addr h0 `+
			`--master-port \d+ --threads 1 --subnet 10.9.0.0/24 --model mlp --hidden 32 --epochs 1 --batch 64 --k 2 `+
			`--lr 0.002 --seed 42 --limit 512 --data /data/fashion$`, agent[i])
	}
	for _, line := range python {
		assert.True(t, strings.HasPrefix(line, "#!/usr/bin/env python3 | - --rank "), "the script on standard input: %s", line)
	}
	for _, name := range []string{"NetworkEndToEnd/model=mlp-32/impl=goaccel/k=2/rate=hosts/procs=2 ",
		"NetworkEndToEnd/model=mlp-32/impl=pytorch/k=2/rate=hosts/procs=2 "} {
		assert.Contains(t, benchstat.String(), "Benchmark"+name)
	}

	md := report(&results{Plan: d.plan, Network: out})
	assert.Contains(t, md, "## 6. On a network")
	assert.Contains(t, md, "on the hosts h0:1, h1:1, their network as it is")
	assert.Contains(t, md, "| the hosts' network | 2 | 2000 ±0% | 1000 ±0% | 2.00× | 0.5000 | 0.4000 |")
	assert.NotContains(t, md, "**The links.**", "nothing throttled them")
	assert.Contains(t, md, "| 6. Network: sync against the link | bucketed sync ≤ 1.1 × the link's limit 2(N−1)/N·S/B at "+
		"1 Gbit/s | — | — |", "no rate to judge it at")
}

// TestNetworkPyTorchRankFails: a PyTorch process that fails ends the run at once, its rank named, and the
// other, which would wait for it until gloo's timeout, is stopped.
func TestNetworkPyTorchRankFails(t *testing.T) {
	s := newStandIns(t, nil, `cat > /dev/null
case " $* " in
*" --rank 1 "*) echo "rank 1 fails" >&2; exit 3 ;;
*) exec sleep 600 ;;
esac`)
	d, _ := plumbingDriver(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a watchdog: the sleeper must be stopped
	defer cancel()
	_, err := d.trainOnNetwork(ctx, d.hosts, "pytorch", d.plan.Network.Models[0], 2, modePlain)
	require.Error(t, err)
	require.NoError(t, ctx.Err(), "the failed rank did not stop the other")
	assert.Contains(t, err.Error(), "rank 1 (")
	assert.Contains(t, err.Error(), "exit status 3")
}

// TestNetworkSkippedWithoutClusters: where emulated clusters cannot be built, the section measures nothing,
// says why, and the page says it was not measured instead of judging its goals.
func TestNetworkSkippedWithoutClusters(t *testing.T) {
	saved := clustersAvailable
	t.Cleanup(func() { clustersAvailable = saved })
	clustersAvailable = func() error { return errors.New("netcluster: network namespaces need root") }
	p := quickPlan()
	require.NoError(t, p.only("network"))
	var progress bytes.Buffer
	d := &driver{plan: p, progress: &progress, benchstat: &bytes.Buffer{}}
	out, skipped, err := d.measureNetwork(context.Background())
	require.NoError(t, err)
	assert.Empty(t, out)
	assert.Equal(t, "netcluster: network namespaces need root", skipped)
	assert.Contains(t, progress.String(), "network: not measured: netcluster: network namespaces need root")

	md := report(&results{Plan: p, NetworkSkipped: skipped})
	assert.Contains(t, md, "> Section 6 (on a network) was not measured: netcluster: network namespaces need root.")
	assert.NotContains(t, md, "## 6. On a network")
	for _, g := range networkGoals(&results{Plan: p}) {
		assert.False(t, g.known, g.what)
	}
}

func TestParseHostSet(t *testing.T) {
	tests := []struct {
		hosts, agent, network string
		want                  []string // slots, then gloo's network flags
		err                   string
	}{
		{hosts: "", want: nil},
		{hosts: "a:2,b:2", want: []string{"4"}},
		{hosts: "a,b", network: "eth1", want: []string{"2", "--ifname", "eth1"}},
		{hosts: "a,b", network: "10.0.0.0/24,eth0", want: []string{"2", "--subnet", "10.0.0.0/24"}},
		{hosts: "", agent: "ssh -p 2", err: "-launch-agent and -net describe the hosts of -hosts"},
		{hosts: "", network: "eth0", err: "-launch-agent and -net describe the hosts of -hosts"},
		{hosts: "a:0", err: "slots must be a whole number of at least 1"},
		{hosts: "a,b", network: "10.0.0.1/24", err: `has host bits set: the subnet is 10.0.0.0/24`},
	}
	for _, tt := range tests {
		t.Run(tt.hosts+" "+tt.agent+" "+tt.network, func(t *testing.T) {
			h, err := parseHostSet(tt.hosts, tt.agent, tt.network)
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			if tt.want == nil {
				assert.Nil(t, h)
				return
			}
			assert.Equal(t, tt.want, append([]string{string(rune('0' + h.slots()))}, h.glooNetwork...))
			assert.Equal(t, strings.Split(tt.hosts, ",")[0][:1], h.masterAddr, "rank 0's host")
		})
	}
}

// TestGradientLayouts: the layouts whose syncs section 6 times are the demo's models' gradients.
func TestGradientLayouts(t *testing.T) {
	elements := func(l gradientLayout) int64 { return l.bytes() / 4 }
	// 784·1024 + 1024 + 1024·10 + 10: the 3.26 MB (10⁶ bytes) of one sync of the 1024-wide MLP.
	mlp := networkModel{Name: "mlp", Hidden: 1024}.layout()
	assert.EqualValues(t, 814090, elements(mlp))
	assert.Equal(t, "mlp-1024", mlp.Slug)
	// 3·3·1·16 + 16 + 3·3·16·32 + 32 + 1568·128 + 128 + 128·10 + 10: the parameters fashion_ddp.py's twin of the
	// demo's CNN has (sum of numel over its parameters).
	cnn := networkModel{Name: "cnn", Hidden: 128}.layout()
	assert.EqualValues(t, 206922, elements(cnn))
	assert.Equal(t, "cnn-128", cnn.Slug)
	plan, err := newBucketSet(cnn.params(), 0, defaultBucketCapBytes)
	require.NoError(t, err)
	assert.Len(t, plan.plan.Buckets, 1, "0.83 MB fits the 1 MB first bucket")
	deep := networkSyncs(nil, deepMLP())
	require.Len(t, deep, 1)
	assert.Equal(t, "mlp-51layers", deep[0].Slug)
	assert.Equal(t, deepMLP().bytes(), deep[0].bytes())
}

func TestLinkLimitAndRates(t *testing.T) {
	// 2(N−1)/N · S/B: 3.25 MB over 1 Gbit/s links is 26 ms with 2 hosts, 39 ms with 4.
	assert.InDelta(t, 0.026, linkLimit(3_250_000, 2, 1_000_000_000), 1e-9)
	assert.InDelta(t, 0.039, linkLimit(3_250_000, 4, 1_000_000_000), 1e-9)
	assert.Zero(t, linkLimit(3_250_000, 2, 0), "unthrottled: no limit")
	for _, tt := range []struct {
		bits     int64
		emulated bool
		label    string
		name     string
	}{{0, true, "unthrottled", "unthrottled"}, {1e9, true, "1Gbit", "1 Gbit/s"}, {10e9, true, "10Gbit", "10 Gbit/s"},
		{200e6, true, "200Mbit", "200 Mbit/s"}, {0, false, "hosts", "the hosts' network"}} {
		assert.Equal(t, tt.label, rateLabel(tt.bits, tt.emulated))
		assert.Equal(t, tt.name, networkResult{RateBits: tt.bits, Emulated: tt.emulated}.rateName())
	}
	assert.NoError(t, checkLimiter(networkResult{RateBits: 1e9, LinkBits: 1.09e9, Emulated: true}))
	err := checkLimiter(networkResult{RateBits: 1e9, LinkBits: 3e9, Emulated: true})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "limited to 1 Gbit/s, but one TCP stream carried 3 Gbit/s: the limiter is not on")
}

// requirePyTorch skips t without PyTorch, or fails it with CI=true (`make test` installs it).
func requirePyTorch(t *testing.T) {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import torch").Run(); err != nil {
		msg := "PyTorch is not installed (apt-get install python3-torch, or `make deps-torch`): the comparison " +
			"with PyTorch DDP is not tested"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// TestQuickNetwork runs the network section on real emulated clusters, unthrottled and at 1 Gbit/s, with a
// tiny MLP: the link check finds the limiter on, the syncs are timed across the hosts, and both frameworks'
// gradients crossed host 0's link (at least one gradient's bytes per optimizer step). It asserts nothing
// about speed.
func TestQuickNetwork(t *testing.T) {
	netcluster.Require(t)
	ctx, exe, demo := buildForTraining(t)
	stdout, md, res := runQuick(ctx, t, exe, "-only", "network", "-demo", demo)

	p := res.Plan.Network
	require.Len(t, res.Network, len(p.Rates))
	hz, _ := netcluster.KernelHZ()
	layout := p.Models[0].layout()
	for i, rate := range res.Network {
		assert.Equal(t, p.Rates[i], rate.RateBits)
		assert.True(t, rate.Emulated)
		assert.Positive(t, rate.LinkBits)
		if rate.RateBits > 0 {
			assert.Equal(t, netcluster.BurstFor(rate.RateBits, hz), rate.BurstBytes)
			assert.LessOrEqual(t, rate.LinkBits, limiterSlack*float64(rate.RateBits), "the limiter is on")
		}
		require.Len(t, rate.Sync, 1)
		s := rate.Sync[0]
		assert.Equal(t, layout.bytes(), s.Bytes)
		assert.Equal(t, 2, s.Ranks)
		for _, v := range []series{s.Bucketed, s.PerTensor, s.BucketedBF16} {
			assert.Len(t, v.Seconds, p.SyncTiming.Samples, v.Name)
		}
		require.Len(t, rate.Runs, len(networkImpls))
		for _, r := range rate.Runs {
			require.Len(t, r.PerExample.Seconds, 1, r.Impl)
			require.Len(t, r.SentBytes, 1, r.Impl)
			require.Len(t, r.Steps, 1, r.Impl)
			// 512 examples on 2 hosts, 64 per micro-batch, K=2: 2 optimizer steps, each syncing every gradient.
			assert.Equal(t, int64(2), r.Steps[0], r.Impl)
			assert.GreaterOrEqual(t, r.SentBytes[0], uint64(r.Steps[0])*uint64(layout.bytes()),
				"%s at %s: host 0's link carried the syncs", r.Impl, rate.rateName())
			if r.Impl == "goaccel" {
				assert.Positive(t, r.MicroBatchSeconds[0])
			}
		}
	}
	assert.Contains(t, stdout, "BenchmarkNetworkSync/model=mlp-32/bucketed-bf16/rate=1Gbit/ranks=2 ")
	assert.Contains(t, stdout, "BenchmarkNetworkEndToEnd/model=mlp-32/impl=pytorch/k=2/rate=unthrottled/procs=2 ")
	assert.Contains(t, md, "## 6. On a network")
	assert.Contains(t, md, "| 1 Gbit/s | "+formatMegabytes(res.Network[1].BurstBytes)+" | ")
}

// TestQuickAcrossHosts runs accelbench on the first host of an emulated cluster with -hosts, -launch-agent
// and -net, as on a real cluster: the MPI sections' rank job and the network section run across both hosts
// (mpirun lines from package launch, PyTorch through the agent), and their traffic crossed the second
// host's link.
func TestQuickAcrossHosts(t *testing.T) {
	c := netcluster.ForTest(t, 2)
	ctx, exe, demo := buildForTraining(t)
	before, err := c.LinkStats(1)
	require.NoError(t, err)
	_, _, res := runQuickWith(t, func(args []string) *exec.Cmd {
		cmd := c.Command(ctx, 0, exe, append([]string{"-only", "mpi,network", "-demo", demo, "-hosts", c.HostList(1),
			"-launch-agent", c.Agent(), "-net", c.Subnet.String()}, args...)...)
		cmd.WaitDelay = 10 * time.Second
		return cmd
	})
	after, err := c.LinkStats(1)
	require.NoError(t, err)

	require.Equal(t, []int{2}, res.Plan.Ranks, "one job, a process per slot")
	require.NotEmpty(t, res.AllReduce)
	for _, a := range res.AllReduce {
		assert.Equal(t, 2, a.Ranks)
	}
	require.Len(t, res.Network, 1)
	n := res.Network[0]
	assert.False(t, n.Emulated, "the hosts' network as it is")
	assert.Equal(t, c.Hosts[0].Name+":1, "+c.Hosts[1].Name+":1", n.Hosts)
	require.Len(t, n.Sync, 1)
	require.Len(t, n.Runs, len(networkImpls))
	var must uint64
	for _, r := range n.Runs {
		require.Len(t, r.PerExample.Seconds, 1, r.Impl)
		must += uint64(r.Steps[0]) * uint64(n.Sync[0].Bytes)
	}
	assert.GreaterOrEqual(t, after.RxBytes-before.RxBytes, must, "host 1 received every sync of both frameworks")
}
