package netcluster_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/netcluster"
)

func TestMain(m *testing.M) { mpitest.Main(m) }

// hostOutput runs a shell command line on a host and returns its trimmed output.
func hostOutput(t *testing.T, c *netcluster.Cluster, host int, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.Command(ctx, host, "/bin/sh", "-c", script).CombinedOutput()
	require.NoError(t, err, "host %d: %s: %s", host, script, out)
	return strings.TrimSpace(string(out))
}

// TestHostsReachEachOther: on clusters of 2 and 4 hosts every host has its own hostname, resolves every
// host's name to its address, and reaches every other host over TCP on the cluster's subnet, which exists
// only inside the cluster's namespaces.
func TestHostsReachEachOther(t *testing.T) {
	for _, hosts := range []int{2, 4} {
		t.Run(fmt.Sprintf("hosts=%d", hosts), func(t *testing.T) {
			c := netcluster.ForTest(t, hosts)
			names := map[string]bool{}
			for i, h := range c.Hosts {
				assert.Equal(t, h.Name, hostOutput(t, c, i, "hostname"), "host %d's hostname", i)
				names[h.Name] = true
				assert.Equal(t, h.Interface+"\nlo", hostOutput(t, c, i, "ls /sys/class/net"), "host %d's interfaces", i)
				for _, other := range c.Hosts {
					assert.Equal(t, other.Addr.String()+" "+other.Name,
						strings.Join(strings.Fields(hostOutput(t, c, i, "getent hosts "+other.Name)), " "),
						"host %d resolves %s", i, other.Name)
				}
			}
			assert.Len(t, names, hosts, "hostnames differ")
			machine, err := os.Hostname()
			require.NoError(t, err)
			assert.False(t, names[machine])

			// Every host listens; every other host connects and reads the listener's hostname.
			listeners := make([]net.Listener, hosts)
			for i, h := range c.Hosts {
				l, err := c.Listen(i, "tcp", net.JoinHostPort(h.Addr.String(), "0"))
				require.NoError(t, err)
				defer l.Close()
				listeners[i] = l
				go func() {
					for {
						conn, err := l.Accept()
						if err != nil {
							return
						}
						_, _ = fmt.Fprintln(conn, h.Name)
						_ = conn.Close()
					}
				}()
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for from := range c.Hosts {
				for to, l := range listeners {
					if from == to {
						continue
					}
					conn, err := c.DialContext(ctx, from, "tcp", l.Addr().String())
					require.NoError(t, err, "host %d → host %d", from, to)
					line, err := bufio.NewReader(conn).ReadString('\n')
					require.NoError(t, err)
					assert.Equal(t, c.Hosts[to].Name+"\n", line, "host %d → host %d", from, to)
					local := conn.LocalAddr().(*net.TCPAddr)
					assert.Equal(t, c.Hosts[from].Addr.String(), local.IP.String(), "host %d → host %d went out from", from, to)
					_ = conn.Close()
				}
			}
			// The machine's own namespace has neither the subnet nor the cluster's interfaces.
			out, err := exec.Command("ip", "-j", "addr").Output()
			require.NoError(t, err)
			var links []struct {
				IfName   string `json:"ifname"`
				AddrInfo []struct {
					Local string `json:"local"`
				} `json:"addr_info"`
			}
			require.NoError(t, json.Unmarshal(out, &links))
			for _, l := range links {
				assert.NotContains(t, l.IfName, c.ID)
				for _, a := range l.AddrInfo {
					if ip := net.ParseIP(a.Local); ip != nil && ip.To4() != nil {
						assert.False(t, c.Subnet.Contains(mustAddr(t, a.Local)), "%s has %s in the root namespace", l.IfName, a.Local)
					}
				}
			}
		})
	}
}

// TestRateLimit: a link limited to 200 Mbit/s carries 16 MB between two hosts at no more than 1.5 times
// that rate. Only an upper bound is checked (a loaded machine is only slower): this checks that the
// limiter limits, it is not a speed goal. The token bucket is two timer ticks at the rate.
func TestRateLimit(t *testing.T) {
	const rate = 200e6
	c := netcluster.ForTest(t, 2, netcluster.WithRate(rate))
	hz, err := netcluster.KernelHZ()
	if err != nil {
		t.Log(err)
	}
	require.Equal(t, netcluster.BurstFor(rate, hz), c.BurstBytes)
	require.EqualValues(t, rate/8*2/int64(hz), c.BurstBytes)
	qdisc := hostOutput(t, c, 0, "tc -j qdisc show dev "+c.Hosts[0].Interface)
	var qdiscs []struct {
		Kind    string `json:"kind"`
		Options struct {
			Rate  int64 `json:"rate"`
			Burst int64 `json:"burst"`
		} `json:"options"`
	}
	require.NoError(t, json.Unmarshal([]byte(qdisc), &qdiscs), qdisc)
	require.Len(t, qdiscs, 1)
	assert.Equal(t, "tbf", qdiscs[0].Kind)
	assert.EqualValues(t, rate/8, qdiscs[0].Options.Rate, "tc reports bytes per second")

	const size = 16 << 20
	l, err := c.Listen(1, "tcp", net.JoinHostPort(c.Hosts[1].Addr.String(), "0"))
	require.NoError(t, err)
	defer l.Close()
	received := make(chan error, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			received <- err
			return
		}
		defer conn.Close()
		n, err := io.Copy(io.Discard, conn)
		if err == nil && n != size {
			err = fmt.Errorf("received %d bytes, want %d", n, size)
		}
		received <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := c.DialContext(ctx, 0, "tcp", l.Addr().String())
	require.NoError(t, err)
	start := time.Now()
	_, err = conn.Write(make([]byte, size))
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	require.NoError(t, <-received)
	elapsed := time.Since(start)
	throughput := float64(size) * 8 / elapsed.Seconds()
	assert.Less(t, throughput, 1.5*rate, "16 MB took %s: %.0f Mbit/s through a 200 Mbit/s link", elapsed, throughput/1e6)
	t.Logf("16 MB in %s: %.0f Mbit/s (limit 200)", elapsed, throughput/1e6)
}

// TestSetLinkAndProcesses: a host whose link is down keeps its processes (Processes lists them) but
// reaches no other host, and reaches them again once the link is back up.
func TestSetLinkAndProcesses(t *testing.T) {
	c := netcluster.ForTest(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sleeper := c.Command(ctx, 1, "sleep", "60")
	require.NoError(t, sleeper.Start())
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	// The command enters host 1's namespace after it starts (`ip netns exec` does it, then runs sleep).
	assert.Eventually(t, func() bool {
		pids, err := c.Processes(1)
		return err == nil && slices.Contains(pids, sleeper.Process.Pid)
	}, 30*time.Second, 10*time.Millisecond, "sleep (pid %d) runs on host 1", sleeper.Process.Pid)
	pids, err := c.Processes(0)
	require.NoError(t, err)
	assert.NotContains(t, pids, sleeper.Process.Pid)

	l, err := c.Listen(0, "tcp", net.JoinHostPort(c.Hosts[0].Addr.String(), "0"))
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_ = conn.Close()
		}
	}()
	require.NoError(t, c.SetLink(1, false))
	_, err = c.DialContext(ctx, 1, "tcp", l.Addr().String())
	assert.Error(t, err, "host 1's link is down")
	require.NoError(t, c.SetLink(1, true))
	conn, err := c.DialContext(ctx, 1, "tcp", l.Addr().String())
	require.NoError(t, err, "host 1's link is up again")
	_ = conn.Close()
}

// leftovers lists what of cluster id remains on the machine: namespaces, hosts files, UTS namespace
// files, the agent's directory.
func leftovers(t *testing.T, id string) []string {
	t.Helper()
	var found []string
	for _, pattern := range []string{"/run/netns/" + id + "-*", "/etc/netns/" + id + "-*",
		"/run/goaccel-netcluster/" + id, filepath.Join(os.TempDir(), id+"-*")} {
		matches, err := filepath.Glob(pattern)
		require.NoError(t, err)
		found = append(found, matches...)
	}
	out, err := exec.Command("ip", "-o", "link").Output()
	require.NoError(t, err)
	if strings.Contains(string(out), id) {
		found = append(found, "a link named after the cluster in the root namespace")
	}
	return found
}

// alive reports whether pid is a running process (not a zombie).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// TestCloseLeavesNothing: Close kills the processes left on the hosts (one started by Command, one by the
// agent) and removes every namespace, file and directory the cluster made.
func TestCloseLeavesNothing(t *testing.T) {
	netcluster.Require(t)
	c, err := netcluster.New(2)
	require.NoError(t, err)
	require.NotEmpty(t, leftovers(t, c.ID))
	ctx := context.Background()
	direct := c.Command(ctx, 1, "sleep", "600")
	require.NoError(t, direct.Start())
	viaAgent := exec.Command(c.Agent(), c.Hosts[0].Name, "sleep", "600")
	require.NoError(t, viaAgent.Start())
	waited := make(chan error, 2)
	go func() { waited <- direct.Wait() }()
	go func() { waited <- viaAgent.Wait() }()

	require.NoError(t, c.Close())
	for range 2 {
		select {
		case err := <-waited:
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "%v", err)
			assert.Equal(t, "signal: killed", exit.Error())
		case <-time.After(time.Minute):
			t.Fatal("a process on the cluster outlived Close")
		}
	}
	assert.Empty(t, leftovers(t, c.ID))
	assert.NoError(t, c.Close(), "closing twice")
}

const orphanEnv = "NETCLUSTER_TEST_ORPHAN"

// TestSweepRemovesClustersOfDeadProcesses: a process that builds a cluster, starts a process on it and is
// killed (a test binary killed by its timeout, whose cleanups never run) leaves the cluster behind; Sweep
// removes it and kills the process.
func TestSweepRemovesClustersOfDeadProcesses(t *testing.T) {
	if os.Getenv(orphanEnv) != "" {
		c, err := netcluster.New(2)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		sleeper := exec.Command(c.Agent(), c.Hosts[1].Name, "sleep", "600")
		if err := sleeper.Start(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(c.ID, sleeper.Process.Pid)
		time.Sleep(10 * time.Minute) // until killed
		os.Exit(1)
	}
	netcluster.Require(t)
	self, err := os.Executable()
	require.NoError(t, err)
	orphan := exec.Command(self, "-test.run=^TestSweepRemovesClustersOfDeadProcesses$")
	orphan.Env = append(os.Environ(), orphanEnv+"=1")
	stdout, err := orphan.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, orphan.Start())
	defer func() { _ = orphan.Process.Kill(); _ = orphan.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "%s", line)
	var id string
	var pid int
	_, err = fmt.Sscan(line, &id, &pid)
	require.NoError(t, err, "%s", line)
	require.NotEmpty(t, leftovers(t, id), "the cluster is there")
	require.True(t, alive(pid), "its process runs")

	require.NoError(t, orphan.Process.Kill())
	_ = orphan.Wait()
	require.NoError(t, netcluster.Sweep())
	assert.Empty(t, leftovers(t, id))
	assert.Eventually(t, func() bool { return !alive(pid) }, time.Minute, 50*time.Millisecond,
		"the sweep kills process %d", pid)
}

// TestAgentRunsLikeSSH: the agent runs a command on the named host (by name or address) as sshd would:
// in the home directory, with a login environment and not the caller's; an unknown host is an error
// (exit code 255, ssh's).
func TestAgentRunsLikeSSH(t *testing.T) {
	c := netcluster.ForTest(t, 2)
	t.Setenv("NETCLUSTER_CALLERS_VARIABLE", "caller")
	for _, host := range []string{c.Hosts[1].Name, c.Hosts[1].Addr.String()} {
		out, err := exec.Command(c.Agent(), host, "hostname;", "pwd;", "echo", "[$NETCLUSTER_CALLERS_VARIABLE]",
			"$HOME").CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Equal(t, c.Hosts[1].Name+"\n/root\n[] /root\n", string(out), "via %s", host)
	}
	out, err := exec.Command(c.Agent(), "elsewhere", "true").CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "%v: %s", err, out)
	assert.Equal(t, 255, exit.ExitCode())
	assert.Contains(t, string(out), "no host elsewhere in cluster "+c.ID)
}

func TestNewRefusesBadSizes(t *testing.T) {
	for _, tc := range []struct {
		hosts int
		opts  []netcluster.Option
		want  string
	}{
		{0, nil, "1 to 16 hosts, not 0"},
		{17, nil, "1 to 16 hosts, not 17"},
		{2, []netcluster.Option{netcluster.WithRate(-1)}, "rate -1 bit/s is negative"},
	} {
		_, err := netcluster.New(tc.hosts, tc.opts...)
		require.ErrorContains(t, err, tc.want)
	}
}

func TestBurstFor(t *testing.T) {
	for _, tc := range []struct {
		rate int64
		hz   int
		want int64
	}{
		{1e9, 250, 1_000_000}, // 125 MB/s × 8 ms
		{10e9, 250, 10_000_000},
		{1e9, 1000, 250_000},
		{1e9, 0, 1_000_000},  // DefaultHZ
		{1e6, 250, 2 * 1514}, // two frames at least
	} {
		assert.Equal(t, tc.want, netcluster.BurstFor(tc.rate, tc.hz), "%d bit/s at HZ %d", tc.rate, tc.hz)
	}
	hz, err := netcluster.KernelHZ()
	if err == nil {
		assert.Contains(t, []int{100, 250, 300, 1000}, hz)
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	require.NoError(t, err)
	return a
}
