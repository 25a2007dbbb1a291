// Package netcluster builds an emulated cluster of hosts on one Linux machine, for tests that need a real
// network between ranks: with every rank on one host Open MPI moves gradients through shared memory, and
// nothing of what a network costs is exercised.
//
// Each host is a network namespace with its own hostname (a UTS namespace: Open MPI tells nodes apart by
// hostname, and two ranks that believe they share a node talk through shared memory instead of the
// network), a veth pair whose other end is a port of a bridge, and an address on a private subnet
// (DefaultSubnet). The bridge lives in a namespace of its own, so the subnet exists only inside namespaces
// the cluster made: nothing is added to the machine's own network namespace. Every host has lo up, and
// resolves every host's name through its own /etc/hosts (/etc/netns/NAMESPACE/hosts, which `ip netns
// exec` mounts over /etc/hosts). WithRate limits each host's link, both ways, with a token-bucket filter
// (`tc qdisc tbf`); there is no delay emulation (the kernel lacks netem), so latency is the kernel's own.
//
// Commands run on a host through [Cluster.Command]; the cluster's launch agent ([Cluster.Agent]) does the
// same for Open MPI's rsh launcher, which calls it as `AGENT HOST COMMAND...` where it would call ssh. Like
// sshd, the agent starts the command with a login environment (HOME, PATH, USER, LOGNAME, SHELL) in the
// home directory, not with the caller's environment: what a job needs on the other hosts must be
// forwarded with mpirun's -x, as on a real cluster.
//
// # Running Open MPI across the hosts
//
// mpirun runs on host 0 (the head) and starts its daemons on the others through the agent:
//
//	cmd := cluster.Command(ctx, 0, "mpirun", append(cluster.MPIRunArgs(2),
//		"--allow-run-as-root", "-x", "GOACCEL_COLLECTIVE_TIMEOUT", "-np", "4", "./program")...)
//
// MPIRunArgs(2) on a cluster of two hosts gives the words that work with Open MPI 4.1:
//
//	--host HOST0:2,HOST1:2                 the hosts and their slots (or a hostfile)
//	--mca plm_rsh_agent AGENT             start the remote daemons through the agent, not ssh
//	--mca btl_tcp_if_include 10.213.0.0/24  the ranks' data over the cluster's subnet only
//	--mca oob_tcp_if_include 10.213.0.0/24  the daemons' control connections too
//	--bind-to none                        the hosts share the machine's cores
//
// Found while building this (what a multi-host launcher needs to know):
//
//   - Open MPI starts one daemon per host through the agent, with a command line like `orted -mca ess
//     "env" ... -mca orte_hnp_uri "...;tcp://10.213.0.1:PORT" ... --tree-spawn ...` that the remote shell
//     must join and run, as ssh does (the agent runs `/bin/sh -c "$*"`). Hosts may be named by hostname
//     or by address; with 4 hosts the daemons are still started through the agent.
//   - No environment reaches the ranks on the other hosts unless mpirun forwards it (-x NAME); the ranks
//     on the head inherit mpirun's, so a job tried on one host does not notice what it lacks.
//   - Ranks on one host talk through shared memory (Open MPI's vader transport), ranks on different hosts
//     over TCP: with 2 hosts × 2 ranks a ring all-reduce crosses the network on two of its four links, and
//     each host's interface carries 1.5 times the buffer per all-reduce each way (2 × 1: once the buffer).
//   - More ranks than the slots given with --host fail at once ("not enough slots"): a launcher given
//     hosts must pass their slots, and must not add --oversubscribe for them.
//   - Inside the cluster each host has only lo and eth0, and Open MPI finds the subnet without the two
//     *_tcp_if_include settings (tried with a plain command, also with a second, unrouted interface on
//     every host). They are passed because hosts with several networks (container bridges, a management
//     network) can offer each other addresses they cannot reach: data (btl) and control (oob) connections
//     are chosen separately, so a launcher's network option must set both.
//   - The hosts share the machine's cores: every rank sees all of them, so ranks that spin while waiting
//     (goaccel's do when their node is not oversubscribed) compete with the ranks of the other hosts.
//
// The cluster needs root, iproute2 (ip and tc) and util-linux (unshare, nsenter). [Available] says whether
// they are there; [ForTest] skips a test when they are not, or fails it when CI=true.
//
// Names carry the creating process's id and a counter (gac<pid>-<n>-h0), so parallel test binaries do not
// collide; Close removes everything, and [Sweep] removes what clusters of processes that died (a test
// binary killed by its timeout) left behind.
package netcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultSubnet is the private subnet of every cluster. It exists only inside the namespaces of a cluster,
// so clusters built side by side (and the machine's own networks) never see each other's.
var DefaultSubnet = netip.MustParsePrefix("10.213.0.0/24")

// MaxHosts bounds the number of hosts of a cluster.
const MaxHosts = 16

// runDir holds the hosts' UTS namespaces, bind-mounted on files so that they outlive the process that
// made them, as `ip netns add` keeps network namespaces in /run/netns.
const runDir = "/run/goaccel-netcluster"

// namePrefix starts every name a cluster makes.
const namePrefix = "gac"

// commandTimeout bounds every ip, tc and unshare the cluster runs: none takes long, and a hung one
// must not hang the test.
const commandTimeout = time.Minute

// Host is one host of a cluster.
type Host struct {
	// Name is the host's hostname, which every host resolves to Addr.
	Name string
	// Namespace is its network namespace (`ip netns exec NAMESPACE ...`).
	Namespace string
	// Addr is its address on the cluster's subnet, on its interface Interface.
	Addr      netip.Addr
	Interface string
	// uts is the file its UTS namespace is mounted on.
	uts string
}

// Cluster is an emulated cluster; Close removes it.
type Cluster struct {
	// ID names the cluster: every name it made starts with it.
	ID     string
	Subnet netip.Prefix
	Hosts  []Host
	// RateBits is each host link's rate limit in bits per second (0: none), and BurstBytes the token
	// bucket's size.
	RateBits   int64
	BurstBytes int64

	bridgeNS string
	dir      string // the agent and other files of the cluster
	tools    tools
	closed   bool
}

// tools are the absolute paths of the programs the cluster runs: the agent runs them from inside host
// namespaces, with a login environment's PATH.
type tools struct{ ip, tc, unshare, nsenter string }

// Option configures New.
type Option func(*config)

type config struct {
	rateBits int64
}

// WithRate limits every host's link to bitsPerSecond in each direction (e.g. 1e9 for 1 Gbit/s), with a
// token bucket of two timer ticks at that rate (see BurstFor).
func WithRate(bitsPerSecond int64) Option { return func(c *config) { c.rateBits = bitsPerSecond } }

var seq atomic.Int64

// New builds a cluster of hosts (1 to MaxHosts) on this machine. On failure it removes what it made.
func New(hosts int, opts ...Option) (*Cluster, error) {
	cfg := config{}
	for _, opt := range opts {
		opt(&cfg)
	}
	if hosts < 1 || hosts > MaxHosts {
		return nil, fmt.Errorf("netcluster: a cluster has 1 to %d hosts, not %d", MaxHosts, hosts)
	}
	if cfg.rateBits < 0 {
		return nil, fmt.Errorf("netcluster: rate %d bit/s is negative", cfg.rateBits)
	}
	t, err := findTools()
	if err != nil {
		return nil, err
	}
	id := fmt.Sprintf("%s%d-%d", namePrefix, os.Getpid(), seq.Add(1))
	c := &Cluster{ID: id, Subnet: DefaultSubnet, bridgeNS: id + "-br", tools: t, RateBits: cfg.rateBits}
	if c.RateBits > 0 {
		hz, _ := KernelHZ() // DefaultHZ when unreadable, as documented
		c.BurstBytes = BurstFor(c.RateBits, hz)
	}
	addr := c.Subnet.Addr()
	for i := range hosts {
		addr = addr.Next()
		name := fmt.Sprintf("%s-h%d", id, i)
		c.Hosts = append(c.Hosts, Host{Name: name, Namespace: name, Addr: addr, Interface: "eth0",
			uts: filepath.Join(runDir, id, name+".uts")})
	}
	if err := c.build(); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

func (c *Cluster) build() error {
	var err error
	if c.dir, err = os.MkdirTemp("", c.ID+"-"); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(runDir, c.ID), 0o755); err != nil {
		return err
	}
	if err := c.ip("netns", "add", c.bridgeNS); err != nil {
		return err
	}
	if err := c.ip("-n", c.bridgeNS, "link", "set", "lo", "up"); err != nil {
		return err
	}
	if err := c.ip("-n", c.bridgeNS, "link", "add", "br0", "type", "bridge"); err != nil {
		return err
	}
	if err := c.ip("-n", c.bridgeNS, "link", "set", "br0", "up"); err != nil {
		return err
	}
	hosts := c.hostsFile()
	for i, h := range c.Hosts {
		port := fmt.Sprintf("h%d", i)
		steps := [][]string{
			{"netns", "add", h.Namespace},
			{"-n", h.Namespace, "link", "set", "lo", "up"},
			// Made inside the host's namespace with its peer inside the bridge's: neither end is ever in
			// the machine's own namespace.
			{"-n", h.Namespace, "link", "add", h.Interface, "type", "veth", "peer", "name", port, "netns", c.bridgeNS},
			{"-n", c.bridgeNS, "link", "set", port, "master", "br0"},
			{"-n", c.bridgeNS, "link", "set", port, "up"},
			{"-n", h.Namespace, "addr", "add", netip.PrefixFrom(h.Addr, c.Subnet.Bits()).String(), "dev", h.Interface},
			{"-n", h.Namespace, "link", "set", h.Interface, "up"},
		}
		for _, args := range steps {
			if err := c.ip(args...); err != nil {
				return err
			}
		}
		if c.RateBits > 0 {
			if err := c.limit(h.Namespace, h.Interface); err != nil {
				return err
			}
			if err := c.limit(c.bridgeNS, port); err != nil {
				return err
			}
		}
		etc := filepath.Join("/etc/netns", h.Namespace)
		if err := os.MkdirAll(etc, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(etc, "hosts"), hosts, 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(h.uts, nil, 0o644); err != nil {
			return err
		}
		if err := runTool(c.tools.unshare, "--uts="+h.uts, "hostname", h.Name); err != nil {
			return err
		}
	}
	return c.writeAgent()
}

// limit puts a token-bucket filter of the cluster's rate on dev's egress in namespace ns.
func (c *Cluster) limit(ns, dev string) error {
	return runTool(c.tools.tc, "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
		"rate", strconv.FormatInt(c.RateBits, 10)+"bit", "burst", strconv.FormatInt(c.BurstBytes, 10),
		"latency", "50ms")
}

// BurstFor is the token bucket for a link of bitsPerSecond: the bytes the link sends in two timer ticks of
// a kernel ticking hz times a second, and at least two full-size frames. tbf refills its bucket as time
// passes, but a burst much larger than what the link carries between two ticks lets a whole gradient
// sync through at once, and the link looks unthrottled; one much smaller cannot keep the rate.
func BurstFor(bitsPerSecond int64, hz int) int64 {
	if hz <= 0 {
		hz = DefaultHZ
	}
	const minBurst = 2 * 1514
	return max(bitsPerSecond/8*2/int64(hz), minBurst)
}

// DefaultHZ is the timer frequency assumed when the kernel's configuration cannot be read: Debian's and
// Ubuntu's kernels tick 250 times a second.
const DefaultHZ = 250

// KernelHZ reads CONFIG_HZ from the running kernel's configuration (/proc/config.gz, else
// /boot/config-RELEASE). Without either it returns DefaultHZ and an error saying so.
func KernelHZ() (int, error) {
	var config []byte
	if out, err := exec.Command("sh", "-c", "zcat /proc/config.gz 2>/dev/null || cat /boot/config-$(uname -r)").Output(); err == nil {
		config = out
	}
	if m := regexp.MustCompile(`(?m)^CONFIG_HZ=(\d+)$`).FindSubmatch(config); m != nil {
		if hz, err := strconv.Atoi(string(m[1])); err == nil && hz > 0 {
			return hz, nil
		}
	}
	return DefaultHZ, fmt.Errorf("netcluster: the kernel's CONFIG_HZ is not readable; assuming %d", DefaultHZ)
}

// hostsFile is every host's /etc/hosts.
func (c *Cluster) hostsFile() []byte {
	var b bytes.Buffer
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	for _, h := range c.Hosts {
		fmt.Fprintf(&b, "%s\t%s\n", h.Addr, h.Name)
	}
	return b.Bytes()
}

// loginEnv is the environment a command starts with on a host, as sshd gives a login.
var loginEnv = []string{"HOME=/root", "USER=root", "LOGNAME=root", "SHELL=/bin/sh",
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// writeAgent writes the launch agent: a shell script that maps a host's name (or address) to its
// namespaces and runs the command there in a login environment, from the home directory, as sshd runs a
// remote command: the words joined into one line for the shell.
func (c *Cluster) writeAgent() error {
	var b strings.Builder
	fmt.Fprintf(&b, "#!/bin/sh\n# Launch agent of the emulated cluster %s: `agent HOST COMMAND...` runs COMMAND on HOST\n"+
		"# as `ssh HOST COMMAND...` would (for Open MPI's --mca plm_rsh_agent).\n", c.ID)
	b.WriteString("if [ $# -lt 2 ]; then echo \"usage: $0 HOST COMMAND...\" >&2; exit 255; fi\nhost=\"$1\"; shift\ncase \"$host\" in\n")
	for _, h := range c.Hosts {
		fmt.Fprintf(&b, "%s|%s) ns=%s; uts=%s ;;\n", h.Name, h.Addr, h.Namespace, h.uts)
	}
	fmt.Fprintf(&b, "*) echo \"$0: no host $host in cluster %s\" >&2; exit 255 ;;\nesac\n", c.ID)
	fmt.Fprintf(&b, "exec %s netns exec \"$ns\" %s --uts=\"$uts\" -- env -i %s /bin/sh -c \"cd && $*\"\n",
		c.tools.ip, c.tools.nsenter, strings.Join(loginEnv, " "))
	return os.WriteFile(c.Agent(), []byte(b.String()), 0o755)
}

// Agent is the path of the cluster's launch agent, for mpirun's --mca plm_rsh_agent.
func (c *Cluster) Agent() string { return filepath.Join(c.dir, "agent") }

// HostList is mpirun's --host value with slots per host: "HOST0:2,HOST1:2".
func (c *Cluster) HostList(slots int) string {
	parts := make([]string, len(c.Hosts))
	for i, h := range c.Hosts {
		parts[i] = fmt.Sprintf("%s:%d", h.Name, slots)
	}
	return strings.Join(parts, ",")
}

// MPIRunArgs are the mpirun words that place slots ranks on every host and keep Open MPI's data and
// control traffic on the cluster's subnet (see the package documentation).
func (c *Cluster) MPIRunArgs(slots int) []string {
	return []string{"--host", c.HostList(slots), "--mca", "plm_rsh_agent", c.Agent(),
		"--mca", "btl_tcp_if_include", c.Subnet.String(), "--mca", "oob_tcp_if_include", c.Subnet.String(),
		"--bind-to", "none"}
}

// Command returns a command that runs name with args on host, with its hostname, network and /etc/hosts,
// and the caller's environment and working directory (set cmd.Env or cmd.Dir to change them).
func (c *Cluster) Command(ctx context.Context, host int, name string, args ...string) *exec.Cmd {
	h := c.Hosts[host]
	return exec.CommandContext(ctx, c.tools.ip, append([]string{"netns", "exec", h.Namespace, c.tools.nsenter,
		"--uts=" + h.uts, "--", name}, args...)...)
}

// Listen is net.Listen on host: the socket is made in the host's network namespace.
func (c *Cluster) Listen(host int, network, address string) (net.Listener, error) {
	var l net.Listener
	err := c.inNamespace(host, func() (err error) { l, err = net.Listen(network, address); return err })
	return l, err
}

// DialContext is net.Dialer.DialContext from host: the socket is made in the host's network namespace.
func (c *Cluster) DialContext(ctx context.Context, host int, network, address string) (net.Conn, error) {
	var conn net.Conn
	err := c.inNamespace(host, func() (err error) {
		conn, err = (&net.Dialer{}).DialContext(ctx, network, address)
		return err
	})
	return conn, err
}

// inNamespace runs fn on an OS thread moved into host's network namespace. A socket belongs to the
// namespace it was made in, wherever it is used afterwards. The thread is never given back to Go's
// scheduler: its goroutine exits locked, which ends the thread.
func (c *Cluster) inNamespace(host int, fn func() error) error {
	ns, err := os.Open(filepath.Join("/run/netns", c.Hosts[host].Namespace))
	if err != nil {
		return fmt.Errorf("netcluster: %w", err)
	}
	defer ns.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("netcluster: entering %s: %w", c.Hosts[host].Namespace, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// SetLink takes host's interface down (up false) or back up: the host's namespace and its processes stay,
// but it reaches no other host, as a machine whose cable was pulled. Taking it down also removes its route
// to the subnet, so connections from it fail at once (no route) rather than time out.
func (c *Cluster) SetLink(host int, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	h := c.Hosts[host]
	return c.ip("-n", h.Namespace, "link", "set", h.Interface, state)
}

// Processes lists the processes running on host (in its network namespace), as `ip netns pids` does.
func (c *Cluster) Processes(host int) ([]int, error) {
	out, err := outputOf(c.tools.ip, "netns", "pids", c.Hosts[host].Namespace)
	if err != nil {
		return nil, err
	}
	return parsePids(out), nil
}

// LinkStats are the bytes a host's interface received and sent.
type LinkStats struct{ RxBytes, TxBytes uint64 }

// LinkStats reads host's interface counters.
func (c *Cluster) LinkStats(host int) (LinkStats, error) {
	h := c.Hosts[host]
	out, err := outputOf(c.tools.ip, "-n", h.Namespace, "-s", "-j", "link", "show", "dev", h.Interface)
	if err != nil {
		return LinkStats{}, err
	}
	var links []struct {
		Stats struct {
			Rx struct{ Bytes uint64 } `json:"rx"`
			Tx struct{ Bytes uint64 } `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return LinkStats{}, fmt.Errorf("netcluster: reading %s's counters from %q: %v", h.Name, out, err)
	}
	return LinkStats{RxBytes: links[0].Stats.Rx.Bytes, TxBytes: links[0].Stats.Tx.Bytes}, nil
}

// Close kills every process left in the cluster's namespaces and removes the namespaces (with their
// interfaces and the bridge), the UTS namespace files, the hosts files and the agent. It goes on past
// errors and returns them all; closing twice does nothing.
func (c *Cluster) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	var names []string
	for _, h := range c.Hosts {
		names = append(names, h.Namespace)
	}
	err := removeNamespaces(c.tools, append(names, c.bridgeNS), filepath.Join(runDir, c.ID))
	if c.dir != "" {
		err = errors.Join(err, os.RemoveAll(c.dir))
	}
	return err
}

// removeNamespaces kills the processes of the network namespaces names, deletes them (and their
// /etc/netns directories), and unmounts and removes the UTS namespace files in utsDir.
func removeNamespaces(t tools, names []string, utsDir string) error {
	var errs []error
	existing := map[string]bool{}
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			existing[e.Name()] = true
		}
	}
	// Kill first, every namespace at once: processes of one host (an mpirun) may restart others'.
	for attempt := 0; ; attempt++ {
		left := 0
		for _, ns := range names {
			if !existing[ns] {
				continue
			}
			for _, pid := range namespacePids(t, ns) {
				left++
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if left == 0 {
			break
		}
		if attempt == 100 {
			errs = append(errs, fmt.Errorf("netcluster: %d processes outlived SIGKILL in %v", left, names))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, ns := range names {
		if existing[ns] {
			if err := runTool(t.ip, "netns", "delete", ns); err != nil {
				errs = append(errs, err)
			}
		}
		if err := os.RemoveAll(filepath.Join("/etc/netns", ns)); err != nil {
			errs = append(errs, err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(utsDir, "*.uts"))
	for _, f := range files {
		if err := unix.Unmount(f, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("netcluster: unmounting %s: %w", f, err))
		}
		if err := os.Remove(f); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(utsDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// namespacePids lists the processes in network namespace ns.
func namespacePids(t tools, ns string) []int {
	out, err := outputOf(t.ip, "netns", "pids", ns)
	if err != nil {
		return nil
	}
	return slices.DeleteFunc(parsePids(out), func(pid int) bool { return pid == os.Getpid() })
}

func parsePids(out []byte) []int {
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

var clusterName = regexp.MustCompile(`^` + namePrefix + `(\d+)-(\d+)`)

// Sweep removes what clusters of processes that are no longer running left behind (a test binary killed
// before its cleanup ran): their namespaces and the processes in them, UTS namespace files, hosts files
// and agents. Clusters of running processes are left alone.
func Sweep() error {
	t, err := findTools()
	if err != nil {
		return err
	}
	stale := map[string][]string{} // cluster ID → namespaces
	var ids []string
	add := func(id string) {
		if _, ok := stale[id]; !ok {
			stale[id] = nil
			ids = append(ids, id)
		}
	}
	dead := func(name string) (string, bool) {
		m := clusterName.FindStringSubmatch(name)
		if m == nil {
			return "", false
		}
		pid, _ := strconv.Atoi(m[1])
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			return "", false
		}
		return m[0], true
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if id, ok := dead(e.Name()); ok {
			add(id)
			stale[id] = append(stale[id], e.Name())
		}
	}
	for _, dir := range []string{runDir, "/etc/netns"} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if id, ok := dead(e.Name()); ok {
				add(id)
				if dir == "/etc/netns" {
					stale[id] = append(stale[id], e.Name())
				}
			}
		}
	}
	var errs []error
	for _, id := range ids {
		if err := removeNamespaces(t, dedupe(stale[id]), filepath.Join(runDir, id)); err != nil {
			errs = append(errs, err)
		}
		agents, _ := filepath.Glob(filepath.Join(os.TempDir(), id+"-*"))
		for _, a := range agents {
			errs = append(errs, os.RemoveAll(a))
		}
	}
	return errors.Join(errs...)
}

func dedupe(names []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

var (
	availableOnce sync.Once
	availableErr  error
)

// Available reports whether clusters can be built here, and if not why: it needs root, ip and tc
// (iproute2), unshare and nsenter (util-linux), and a kernel that lets it make a network namespace, which
// it tries once.
func Available() error {
	availableOnce.Do(func() {
		if os.Geteuid() != 0 {
			availableErr = errors.New("netcluster: network namespaces need root")
			return
		}
		t, err := findTools()
		if err != nil {
			availableErr = err
			return
		}
		probe := fmt.Sprintf("%s%d-0-probe", namePrefix, os.Getpid()) // swept like a cluster if left behind
		if err := runTool(t.ip, "netns", "add", probe); err != nil {
			availableErr = fmt.Errorf("netcluster: cannot make a network namespace: %w", err)
			return
		}
		if err := runTool(t.ip, "netns", "delete", probe); err != nil {
			availableErr = err
		}
	})
	return availableErr
}

// MissingMessage says what to install for clusters.
const MissingMessage = "emulated clusters need root, iproute2 (ip, tc) and util-linux (unshare, nsenter): " +
	"bash scripts/install-deps.sh iproute2"

func findTools() (tools, error) {
	var t tools
	var missing []string
	for _, tool := range []struct {
		name string
		path *string
	}{{"ip", &t.ip}, {"tc", &t.tc}, {"unshare", &t.unshare}, {"nsenter", &t.nsenter}} {
		p, err := exec.LookPath(tool.name)
		if err != nil {
			// root's PATH usually has sbin; a test's may not.
			for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
				if _, serr := os.Stat(filepath.Join(dir, tool.name)); serr == nil {
					p, err = filepath.Join(dir, tool.name), nil
					break
				}
			}
		}
		if err != nil {
			missing = append(missing, tool.name)
			continue
		}
		*tool.path = p
	}
	if len(missing) > 0 {
		return t, fmt.Errorf("netcluster: %s not found; %s", strings.Join(missing, ", "), MissingMessage)
	}
	return t, nil
}

func (c *Cluster) ip(args ...string) error { return runTool(c.tools.ip, args...) }

func runTool(name string, args ...string) error {
	_, err := outputOf(name, args...)
	return err
}

func outputOf(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("netcluster: %s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err,
			strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
