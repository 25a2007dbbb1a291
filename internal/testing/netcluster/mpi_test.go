package netcluster_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/backends/enginetest"
	_ "github.com/goaccel/goaccel/backends/mpi" // the ranks open the MPI engine
	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/netcluster"
)

// acrossHosts is a mpitest.Launcher that runs mpirun on host 0 of c with slots ranks per host, as package
// launch builds it for `accel launch --hosts … --launch-agent … --net …`: goaccel's and GoMLX's variables
// are forwarded (the ranks on other hosts get nothing else: the agent starts them in a login environment).
func acrossHosts(c *netcluster.Cluster, slots int) mpitest.Launcher {
	return func(ctx context.Context, np int, binary string, args, env []string, stdout, stderr io.Writer) (*exec.Cmd, error) {
		hosts := make([]launch.Host, len(c.Hosts))
		for i, h := range c.Hosts {
			hosts[i] = launch.Host{Name: h.Name, Slots: slots}
		}
		argv, err := launch.Argv(np, binary, args, launch.WithHosts(hosts...), launch.WithLaunchAgent(c.Agent()),
			launch.WithNetwork(c.Subnet.String()), launch.WithEnviron(env))
		if err != nil {
			return nil, err
		}
		cmd := c.Command(ctx, 0, argv[0], argv[1:]...)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, stdout, stderr
		// Processes left on the other hosts may hold the output open after mpirun is killed; the
		// cluster's Close kills them.
		cmd.WaitDelay = 10 * time.Second
		return cmd, nil
	}
}

// allReduceBytes and allReduces size the timed part of each rank's work: every host must send and
// receive at least allReduces × allReduceBytes for it, whatever the algorithm (the sum on one host
// depends on every byte of the other hosts' buffers, and on this host's).
const (
	allReduceLen   = 1 << 20
	allReduceBytes = 4 * allReduceLen
	allReduces     = 4
)

// hostReport is what a rank of TestMPIAcrossHosts reports.
type hostReport struct {
	Hostname  string
	Topology  backends.Topology
	LocalRank int
	// LinkTx and LinkRx are the bytes its host's interface sent and received during the all-reduces, read
	// by the host's first rank (0 elsewhere).
	LinkTx, LinkRx uint64
	Conformance    string // enginetest.Check's error, if any
}

// TestMPIAcrossHosts: mpirun on the head of an emulated cluster starts ranks on 2 hosts × 1 rank and 2
// hosts × 2 ranks through the agent; Open MPI sees distinct nodes (each rank's hostname is its host's,
// local ranks and sizes count the ranks per host); the engine conformance suite passes across them; and
// the all-reduces crossed the network: each host's interface sent and received at least the bytes they
// must move.
func TestMPIAcrossHosts(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, hostRank)
		return
	}
	for _, tc := range []struct{ hosts, perHost int }{{2, 1}, {2, 2}, {4, 1}} {
		t.Run(fmt.Sprintf("hosts=%d/ranks-per-host=%d", tc.hosts, tc.perHost), func(t *testing.T) {
			c := netcluster.ForTest(t, tc.hosts)
			before := make([]netcluster.LinkStats, tc.hosts)
			for h := range tc.hosts {
				var err error
				before[h], err = c.LinkStats(h)
				require.NoError(t, err)
			}
			np := tc.hosts * tc.perHost
			results := mpitest.Run(t, np, t.Name(), mpitest.WithLauncher(acrossHosts(c, tc.perHost)),
				mpitest.WithTimeout(4*time.Minute))
			for rank, res := range results {
				var rep hostReport
				require.NoError(t, res.Decode(&rep))
				host := rank / tc.perHost // mpirun fills each host's slots in turn
				assert.Empty(t, rep.Conformance, "rank %d", rank)
				assert.Equal(t, c.Hosts[host].Name, rep.Hostname, "rank %d runs on host %d", rank, host)
				assert.Equal(t, rank%tc.perHost, rep.Topology.LocalRank, "rank %d", rank)
				assert.Equal(t, tc.perHost, rep.Topology.LocalSize, "rank %d: Open MPI's ranks on its node", rank)
				assert.Equal(t, tc.hosts, rep.Topology.Nodes, "rank %d", rank)
				if rep.Topology.LocalRank == 0 {
					const must = allReduces * allReduceBytes
					assert.GreaterOrEqual(t, rep.LinkTx, uint64(must), "host %d sent too little for the all-reduces", host)
					assert.GreaterOrEqual(t, rep.LinkRx, uint64(must), "host %d received too little", host)
					t.Logf("host %d: the all-reduces sent %d and received %d bytes over its link (at least %d needed)",
						host, rep.LinkTx, rep.LinkRx, must)
				}
			}
			for h := range tc.hosts {
				after, err := c.LinkStats(h)
				require.NoError(t, err)
				assert.Greater(t, after.TxBytes-before[h].TxBytes, uint64(allReduces*allReduceBytes), "host %d, the whole job", h)
			}
		})
	}
}

// hostRank runs on each rank: the conformance suite, then the timed all-reduces between two barriers,
// with the host's interface counters read around them by the host's first rank.
func hostRank() (any, error) {
	topo, err := backends.DetectTopology()
	if err != nil {
		return nil, err
	}
	comm, err := backends.Open("mpi", topo, backends.WithTimeout(3*time.Minute))
	if err != nil {
		return nil, err
	}
	rep := hostReport{Topology: topo}
	if rep.Hostname, err = os.Hostname(); err != nil {
		return nil, err
	}
	if err := enginetest.Check(comm); err != nil {
		rep.Conformance = err.Error()
	}
	buf := make([]float32, allReduceLen)
	if err := comm.Barrier(); err != nil {
		return nil, err
	}
	tx0, rx0, err := linkCounters()
	if err != nil {
		return nil, err
	}
	for range allReduces {
		for i := range buf {
			buf[i] = float32(topo.Rank + i%7)
		}
		if err := comm.AllReduceSum(backends.BufferOf(buf)); err != nil {
			return nil, err
		}
		for i, v := range buf {
			if want := float32(topo.WorldSize*(topo.WorldSize-1)/2 + topo.WorldSize*(i%7)); v != want {
				return nil, fmt.Errorf("element %d of the sum is %g, want %g", i, v, want)
			}
		}
	}
	if err := comm.Barrier(); err != nil {
		return nil, err
	}
	tx1, rx1, err := linkCounters()
	if err != nil {
		return nil, err
	}
	if topo.LocalRank == 0 {
		rep.LinkTx, rep.LinkRx = tx1-tx0, rx1-rx0
	}
	return rep, comm.Close()
}

// linkCounters reads the counters of the host's eth0 (a rank's /sys is its host's network namespace's).
func linkCounters() (tx, rx uint64, err error) {
	read := func(name string) (uint64, error) {
		data, err := os.ReadFile("/sys/class/net/eth0/statistics/" + name)
		if err != nil {
			return 0, err
		}
		return strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	}
	if tx, err = read("tx_bytes"); err != nil {
		return 0, 0, err
	}
	rx, err = read("rx_bytes")
	return tx, rx, err
}
