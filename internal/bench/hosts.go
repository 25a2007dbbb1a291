package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/netcluster"
)

// hostSet is where multi-host jobs run: the hosts, each with its slots, the launch agent that starts
// commands on them, and the network their traffic keeps to. It is either the hosts of accelbench's -hosts
// flag, with mpirun started where accelbench runs (usually the first host), or an emulated cluster that the
// network section builds, with mpirun started on its host 0.
type hostSet struct {
	hosts []launch.Host
	// agent starts a command on a host as `AGENT HOST COMMAND` (ssh when empty), for mpirun's daemons and
	// for the PyTorch processes.
	agent string
	// network is launch.WithNetwork's value ("" leaves Open MPI's choice): a subnet or interface names.
	network string
	// masterAddr is how the other hosts reach the first one (PyTorch's MASTER_ADDR).
	masterAddr string
	// glooNetwork names gloo's network for the PyTorch script: "--ifname NAME" or "--subnet CIDR" (empty:
	// gloo's own choice, the address the host's name resolves to).
	glooNetwork []string
	// head returns a command that runs argv on the first host, where mpirun runs, with env.
	head func(ctx context.Context, argv, env []string) *exec.Cmd
	// launchOptions are added to every mpirun line (tests name a stand-in mpirun).
	launchOptions []launch.Option
	// cluster is the emulated cluster, nil for -hosts.
	cluster *netcluster.Cluster
}

// parseHostSet reads the -hosts, -launch-agent and -net flags: nil without hosts. mpirun starts where
// accelbench runs and reaches the hosts through the agent; PyTorch's rank 0 runs on the first host.
func parseHostSet(hosts, agent, network string) (*hostSet, error) {
	if hosts == "" {
		if agent != "" || network != "" {
			return nil, fmt.Errorf("-launch-agent and -net describe the hosts of -hosts, which is not given")
		}
		return nil, nil
	}
	list, err := launch.ParseHosts(hosts)
	if err != nil {
		return nil, err
	}
	h := &hostSet{hosts: list, agent: agent, network: network, masterAddr: list[0].Name, head: localCommand}
	if network != "" {
		// Checked now, with the words launch would build, rather than when the first job starts.
		if _, err := launch.Argv(0, "accelbench", nil, launch.WithFlavor(launch.OpenMPI), launch.WithHosts(list...),
			launch.WithNetwork(network)); err != nil {
			return nil, err
		}
		first, _, _ := strings.Cut(network, ",")
		if strings.Contains(first, "/") {
			h.glooNetwork = []string{"--subnet", strings.TrimSpace(first)}
		} else {
			h.glooNetwork = []string{"--ifname", strings.TrimSpace(first)}
		}
	}
	return h, nil
}

// emulatedHostSet is a cluster's hosts, one slot each: mpirun runs in host 0's namespaces, gloo on the
// hosts' cluster interface.
func emulatedHostSet(c *netcluster.Cluster) *hostSet {
	h := &hostSet{agent: c.Agent(), network: c.Subnet.String(), masterAddr: c.Hosts[0].Addr.String(),
		glooNetwork: []string{"--ifname", c.Hosts[0].Interface}, cluster: c}
	for _, host := range c.Hosts {
		h.hosts = append(h.hosts, launch.Host{Name: host.Name, Slots: 1})
	}
	h.head = func(ctx context.Context, argv, env []string) *exec.Cmd {
		cmd := c.Command(ctx, 0, argv[0], argv[1:]...)
		cmd.Env = env
		stopGently(cmd)
		return cmd
	}
	return h
}

// localCommand runs argv on this machine.
func localCommand(ctx context.Context, argv, env []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	stopGently(cmd)
	return cmd
}

// stopGently makes a cancelled context end cmd with SIGTERM, which mpirun forwards to its job (SIGKILL
// would orphan the ranks), and stops waiting for output that processes left on other hosts hold open.
func stopGently(cmd *exec.Cmd) {
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
}

// slots is the number of processes the hosts take.
func (h *hostSet) slots() int {
	n := 0
	for _, host := range h.hosts {
		n += host.Slots
	}
	return n
}

// onePerHost is the same hosts with one slot each.
func (h *hostSet) onePerHost() *hostSet {
	one := *h
	one.hosts = nil
	for _, host := range h.hosts {
		one.hosts = append(one.hosts, launch.Host{Name: host.Name, Slots: 1})
	}
	return &one
}

// describe names the hosts for the report: "gac1-2-h0:1, gac1-2-h1:1".
func (h *hostSet) describe() string {
	parts := make([]string, len(h.hosts))
	for i, host := range h.hosts {
		parts[i] = host.String()
	}
	return strings.Join(parts, ", ")
}

// mpirun returns the command that runs procs copies of program across the hosts, its mpirun line built
// by package launch, with env as the job's environment (launch forwards goaccel's and GoMLX's variables
// in it to every host).
func (h *hostSet) mpirun(ctx context.Context, procs int, program string, args, env []string) (*exec.Cmd, error) {
	opts := append([]launch.Option{launch.WithHosts(h.hosts...), launch.WithEnviron(env)}, h.launchOptions...)
	if h.agent != "" {
		opts = append(opts, launch.WithLaunchAgent(h.agent))
	}
	if h.network != "" {
		opts = append(opts, launch.WithNetwork(h.network))
	}
	argv, err := launch.Argv(procs, program, args, opts...)
	if err != nil {
		return nil, err
	}
	return h.head(ctx, argv, env), nil
}

// onHost returns a command that runs argv on host i through the launch agent, as mpirun starts its
// daemons: `AGENT HOST 'exec ARGV...'`, the words quoted for the remote shell. Like ssh, the agent gives the
// command a login environment, not this process's.
func (h *hostSet) onHost(ctx context.Context, i int, argv []string) *exec.Cmd {
	agent := strings.Fields(h.agent)
	if len(agent) == 0 {
		agent = []string{"ssh"}
	}
	words := append(append(agent[1:len(agent):len(agent)], h.hosts[i].Name), "exec "+launch.String(argv))
	cmd := exec.CommandContext(ctx, agent[0], words...)
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// resultsLinePrefix starts the line in which rank 0 of a rank job writes its results to standard output:
// rank 0 may run on another host than the driver, so a file would not do.
const resultsLinePrefix = "accelbench-results: "

// resultsLine finds the results line in a job's output and writes every other line to rest.
func resultsLine(output []byte, rest io.Writer) ([]byte, bool) {
	var found []byte
	for line := range bytes.Lines(output) {
		if payload, ok := bytes.CutPrefix(line, []byte(resultsLinePrefix)); ok {
			found = bytes.TrimSpace(payload)
			continue
		}
		_, _ = rest.Write(line)
	}
	return found, found != nil
}

// jobEnv is this process's environment with more variables set.
func jobEnv(extra ...string) []string { return append(os.Environ(), extra...) }
