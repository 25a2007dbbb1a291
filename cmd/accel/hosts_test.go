package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/netcluster"
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range []string{builtAccel.dir, builtMinimal.dir} {
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

var builtAccel struct {
	once      sync.Once
	dir, path string
	err       error
}

// accelWithMPI builds accel with the MPI engine (its --check processes need it), once per test binary.
func accelWithMPI(t *testing.T) string {
	t.Helper()
	mpitest.RequireMPIRun(t)
	builtAccel.once.Do(func() {
		if builtAccel.dir, builtAccel.err = os.MkdirTemp("", "accel-test-"); builtAccel.err != nil {
			return
		}
		builtAccel.path = filepath.Join(builtAccel.dir, "accel")
		cmd := exec.Command("go", "build", "-tags", "mpi", "-o", builtAccel.path, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			builtAccel.err = &buildError{err: err, output: string(out)}
		}
	})
	require.NoError(t, builtAccel.err)
	return builtAccel.path
}

type buildError struct {
	err    error
	output string
}

func (e *buildError) Error() string {
	return "go build -tags mpi ./cmd/accel: " + e.err.Error() + "\n" + e.output
}

// launchOn runs `accel launch ARGS...` on host 0 of c, where mpirun runs as on a cluster's first node, and
// returns its exit code and output. A launch that has not ended after limit fails the test.
func launchOn(t *testing.T, c *netcluster.Cluster, limit time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return c.Run(t, 0, limit, accelWithMPI(t), append([]string{"launch"}, args...)...)
}

// hostFlags are the accel launch flags for slots processes on each host of c.
func hostFlags(c *netcluster.Cluster, slots int) []string {
	return []string{"--hosts", c.HostList(slots), "--launch-agent", c.Agent(), "--net", c.Subnet.String()}
}

var (
	checkHostLine  = regexp.MustCompile(`(?m)^  (\S+)\s+rank (\d+)\s+goaccel (.+)$`)
	checkBandwidth = regexp.MustCompile(`(?m)^\s+(\d+) MiB\s+[\d.]+ ms\s+bus bandwidth\s+([\d.]+) Gbit/s`)
)

// TestLaunchCheckAcrossHosts: `accel launch --check` on 2 hosts × 1 process of an emulated cluster reports
// both hosts by name with one process each, the same goaccel build and MPI library on both, and a positive
// bus bandwidth for each all-reduce size, and the hosts' links carried at least the bytes those
// all-reduces must move. On links limited to 200 Mbit/s the bandwidth it reports stays below 1.5 times
// the rate (only an upper bound: a loaded machine is only slower), so it measures the network, not the
// machine.
func TestLaunchCheckAcrossHosts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rateBits int64
	}{{"unthrottled", 0}, {"200 Mbit/s", 200e6}} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []netcluster.Option
			if tc.rateBits > 0 {
				opts = append(opts, netcluster.WithRate(tc.rateBits))
			}
			c := netcluster.ForTest(t, 2, opts...)
			var before [2]netcluster.LinkStats
			for h := range 2 {
				var err error
				before[h], err = c.LinkStats(h)
				require.NoError(t, err)
			}
			code, stdout, stderr := launchOn(t, c, 3*time.Minute, append(hostFlags(c, 1), "--check")...)
			require.Equal(t, 0, code, "stdout: %s\nstderr: %s", stdout, stderr)
			t.Logf("accel launch %s --check:\n%s", launch.String(hostFlags(c, 1)), stdout)

			hosts := checkHostLine.FindAllStringSubmatch(stdout, -1)
			require.Len(t, hosts, 2, stdout)
			for rank, m := range hosts {
				assert.Equal(t, c.Hosts[rank].Name, m[1], "rank %d runs on host %d", rank, rank)
				assert.Equal(t, strconv.Itoa(rank), m[2])
			}
			assert.Equal(t, hosts[0][3], hosts[1][3], "both hosts run one goaccel build and MPI library")
			assert.Contains(t, hosts[0][3], "Open MPI")
			bandwidths := checkBandwidth.FindAllStringSubmatch(stdout, -1)
			require.Len(t, bandwidths, 2, stdout)
			for _, m := range bandwidths {
				gbits, err := strconv.ParseFloat(m[2], 64)
				require.NoError(t, err)
				assert.Positive(t, gbits, "%s MiB", m[1])
				if tc.rateBits > 0 {
					assert.Less(t, gbits*1e9, 1.5*float64(tc.rateBits), "%s MiB all-reduces over links of %d bit/s", m[1], tc.rateBits)
				}
			}
			// Each timed size ran once untimed, then its runs; with two hosts each host sends and receives at
			// least the whole buffer per all-reduce.
			var must uint64
			for _, size := range []struct{ mib, runs uint64 }{{1, 5}, {16, 3}} {
				must += (size.runs + 1) * size.mib << 20
			}
			for h := range 2 {
				after, err := c.LinkStats(h)
				require.NoError(t, err)
				assert.GreaterOrEqual(t, after.TxBytes-before[h].TxBytes, must, "host %d sent", h)
				assert.GreaterOrEqual(t, after.RxBytes-before[h].RxBytes, must, "host %d received", h)
			}
		})
	}
}

// TestLaunchUnreachableHost: a host that cannot be reached fails `accel launch` and `accel launch --check`
// at once, with a message naming it: a name the launch agent cannot reach (as ssh that cannot resolve or
// connect), found by the probe before mpirun starts; and a host whose namespace is there but whose link is
// down, which mpirun's daemon there reports.
func TestLaunchUnreachableHost(t *testing.T) {
	c := netcluster.ForTest(t, 2)
	h0, h1 := c.Hosts[0].Name, c.Hosts[1].Name
	common := []string{"--launch-agent", c.Agent(), "--net", c.Subnet.String()}
	for _, tc := range []struct {
		name, hosts, want string
		linkDown          bool
	}{
		{"a name the agent cannot reach", h0 + ":1,ghost:1", `accel launch: (--check: )?host ghost: cannot be reached ` +
			`through the launch agent: .*no host ghost in cluster`, false},
		{"a host whose link is down", h0 + ":1," + h1 + ":1", `accel launch: (--check: )?host ` + regexp.QuoteMeta(h1) +
			`: (has no working interface on the network ` + regexp.QuoteMeta(c.Subnet.String()) + `|mpirun's daemon there ` +
			`could not open a TCP connection to ` + regexp.QuoteMeta(h0) + `)`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, c.SetLink(1, !tc.linkDown))
			defer func() { require.NoError(t, c.SetLink(1, true)) }()
			for _, mode := range [][]string{{"--check"}, {"--", "hostname"}} {
				args := append(append([]string{"--hosts", tc.hosts}, common...), mode...)
				code, stdout, stderr := launchOn(t, c, 2*time.Minute, args...)
				assert.NotZero(t, code, "accel launch %q", args)
				assert.Regexp(t, tc.want, stderr, "accel launch %q\nstdout: %s", args, stdout)
				t.Logf("accel launch %s:\n%s", launch.String(args), stderr)
			}
		})
	}
}
