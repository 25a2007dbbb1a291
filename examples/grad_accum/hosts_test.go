package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/netcluster"
)

// clusterFlags are the `accel launch` flags for slots processes on each host of c: its hosts, its launch
// agent in place of ssh, and its subnet for MPI's data and control traffic.
func clusterFlags(c *netcluster.Cluster, slots int) []string {
	return []string{"--hosts", c.HostList(slots), "--launch-agent", c.Agent(), "--net", c.Subnet.String()}
}

// mlpParamBytes is the demo's MLP (784 → hidden → 10) in float32: what one gradient sync all-reduces.
func mlpParamBytes(hidden int) uint64 { return uint64(4 * (784*hidden + hidden + hidden*10 + 10)) }

// checkHost is a host line of `accel launch --check`'s report: the host and its ranks.
var checkHost = regexp.MustCompile(`(?m)^  (\S+)\s+ranks? ([\d-]+)\s+goaccel `)

// TestLaunchAcrossHosts: the unchanged demo, through `accel launch --hosts` on an emulated cluster of 2
// hosts × 1 and 2 × 2 processes (launch agent, --net, the environment forwarded by default), reaches the
// test accuracy (±0.005) and the optimizer steps of the same number of processes on one host, with the
// same seed, data, epoch and global batch. `accel launch --check` with the same hosts shows where the
// ranks run (ranks 0-(p-1) on host 0, the rest on host 1), and each host's link carried, during training
// alone, at least the bytes the gradient syncs must move: with two hosts, each host sends and receives at
// least every sync's whole buffer (its half of the ranks cannot complete a sum without the other half's
// contribution to every element).
func TestLaunchAcrossHosts(t *testing.T) {
	accelBin, demoBin := buildLaunchable(t)
	const hidden = 128
	for _, perHost := range []int{1, 2} {
		t.Run(fmt.Sprintf("2 hosts × %d", perHost), func(t *testing.T) {
			np := 2 * perHost
			demoArgs := []string{"-batch", strconv.Itoa(64 / np), "-limit", "12000", "-epochs", "1", "-k", "2", "-quiet",
				"-seed", "5", "-hidden", strconv.Itoa(hidden)}

			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			var out, errOut bytes.Buffer
			oneHost := exec.CommandContext(ctx, accelBin, append([]string{"launch", "-n", strconv.Itoa(np), "--", demoBin}, demoArgs...)...)
			oneHost.Stdout, oneHost.Stderr = &out, &errOut
			require.NoError(t, oneHost.Run(), "stdout: %s\nstderr: %s", &out, &errOut)
			local := parseSummary(t, out.String())

			c := netcluster.ForTest(t, 2)
			flags := clusterFlags(c, perHost)
			code, stdout, stderr := c.Run(t, 0, 3*time.Minute, accelBin, append(append([]string{"launch"}, flags...), "--check")...)
			require.Equal(t, 0, code, "stdout: %s\nstderr: %s", stdout, stderr)
			t.Logf("accel launch %s --check:\n%s", launch.String(flags), stdout)
			placement := checkHost.FindAllStringSubmatch(stdout, -1)
			require.Len(t, placement, 2, stdout)
			for h, m := range placement {
				ranks := strconv.Itoa(h * perHost)
				if perHost > 1 {
					ranks += "-" + strconv.Itoa(h*perHost+perHost-1)
				}
				assert.Equal(t, []string{c.Hosts[h].Name, ranks}, m[1:], "host %d's ranks", h)
			}

			var before [2]netcluster.LinkStats
			for h := range 2 {
				var err error
				before[h], err = c.LinkStats(h)
				require.NoError(t, err)
			}
			args := append(append(flags, "--", demoBin), demoArgs...)
			code, stdout, stderr = c.Run(t, 0, 5*time.Minute, accelBin, append([]string{"launch"}, args...)...)
			require.Equal(t, 0, code, "stdout: %s\nstderr: %s", stdout, stderr)
			hosts := parseSummary(t, stdout)

			assert.Equal(t, np, hosts.WorldSize)
			// The hosts share this machine's kernel, so its processors: each rank's share, as on one host,
			// although mpirun sees perHost ranks per host.
			assert.Equal(t, max(1, runtime.NumCPU()/np), local.ComputeThreads, "threads on one host")
			assert.Equal(t, local.ComputeThreads, hosts.ComputeThreads, "threads on emulated hosts of one kernel")
			assert.Equal(t, local.GlobalBatch, hosts.GlobalBatch)
			assert.Equal(t, local.OptimizerSteps, hosts.OptimizerSteps)
			assert.Equal(t, local.Syncs, hosts.Syncs)
			assert.InDelta(t, float64(local.TestAccuracy), float64(hosts.TestAccuracy), 0.005,
				"%d processes on one host: %.4f, on 2 hosts: %.4f", np, local.TestAccuracy, hosts.TestAccuracy)
			must := uint64(hosts.Syncs) * mlpParamBytes(hidden)
			require.Positive(t, must)
			assert.GreaterOrEqual(t, uint64(hosts.CollectiveBytes), must, "the summary's own count of the syncs' bytes")
			for h := range 2 {
				after, err := c.LinkStats(h)
				require.NoError(t, err)
				sent, received := after.TxBytes-before[h].TxBytes, after.RxBytes-before[h].RxBytes
				assert.GreaterOrEqual(t, sent, must, "host %d sent", h)
				assert.GreaterOrEqual(t, received, must, "host %d received", h)
				t.Logf("host %d: sent %d, received %d bytes during training; %d syncs of %d bytes need %d each way",
					h, sent, received, hosts.Syncs, mlpParamBytes(hidden), must)
			}
			t.Logf("accel launch %s -- grad_accum %s: test accuracy %.4f (one host: %.4f)", launch.String(flags),
				launch.String(demoArgs), hosts.TestAccuracy, local.TestAccuracy)
		})
	}
}

// TestLaunchRankKilledOnAHost: the demo on 2 hosts × 1 process, its rank 1 killed with SIGKILL from inside
// host 1 while both train; the whole job ends with a non-zero exit code and `accel launch` says which rank
// was killed, and on which host, as Open MPI reports it (it leaves the rank out in some runs, and then the
// signal comes from mpirun's exit code). The launch's deadline bounds the time it may take.
func TestLaunchRankKilledOnAHost(t *testing.T) {
	accelBin, demoBin := buildLaunchable(t)
	c := netcluster.ForTest(t, 2)
	logFile := filepath.Join(t.TempDir(), "loss.jsonl")
	args := append(clusterFlags(c, 1), "--output-dir", t.TempDir(), "--", demoBin, "-batch", "16", "-epochs", "3", "-k", "1", "-quiet",
		"-log", logFile)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	job := c.Command(ctx, 0, accelBin, append([]string{"launch"}, args...)...)
	var stdout, stderr bytes.Buffer
	job.Stdout, job.Stderr = &stdout, &stderr
	job.WaitDelay = 10 * time.Second
	require.NoError(t, job.Start())
	waited := make(chan error, 1)
	go func() { waited <- job.Wait() }()
	deadline := time.Now().Add(3 * time.Minute)
	for lossRecords(t, logFile) < 5 {
		select {
		case err := <-waited:
			t.Fatalf("the job ended (%v) before the kill:\nstdout: %s\nstderr: %s", err, &stdout, &stderr)
		case <-time.After(20 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "the job did not start training:\nstderr: %s", &stderr)
	}
	rank1 := rankProcess(t, job.Process.Pid, demoBin, 1)
	onHost1, err := c.Processes(1)
	require.NoError(t, err)
	require.True(t, slices.Contains(onHost1, rank1), "rank 1 (pid %d) runs on host 1", rank1)
	kill := c.Command(ctx, 1, "kill", "-KILL", strconv.Itoa(rank1))
	out, err := kill.CombinedOutput()
	require.NoError(t, err, "%s", out)

	err = <-waited
	require.NoError(t, ctx.Err(), "the job did not end:\nstdout: %s\nstderr: %s", &stdout, &stderr)
	require.Error(t, err)
	assert.NotZero(t, job.ProcessState.ExitCode())
	assert.Regexp(t, `accel launch: the job failed \(exit code \d+\): (rank 1 on host `+regexp.QuoteMeta(c.Hosts[1].Name)+
		`|a process) was killed by signal 9 \(killed\)`, stderr.String())
	t.Logf("accel launch %s, rank 1 killed on host 1:\n%s", launch.String(args), &stderr)
}
