package launch

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

// WithNetwork keeps the job's traffic on one network: a subnet in CIDR notation ("10.0.0.0/24"), an
// interface name ("eth0"), or a comma-separated list of either. Open MPI chooses the network of the ranks'
// data (the TCP transport, btl_tcp_if_include) and of its own control connections between mpirun and its
// daemons (oob_tcp_if_include) separately, and on hosts with several networks (container bridges, a
// management network) either may otherwise pick an address the other hosts cannot reach: both are set.
// MPICH's Hydra takes an interface name only (-iface).
func WithNetwork(network string) Option { return func(c *config) { c.network = network } }

// WithLaunchAgent names the command that starts mpirun's daemons on the other hosts in place of ssh (Open
// MPI's plm_rsh_agent, MPICH's -launcher-exec): "ssh -p 2222 -o StrictHostKeyChecking=no", or a script
// that runs `AGENT HOST COMMAND...` as ssh would. mpirun splits it on spaces.
func WithLaunchAgent(command string) Option { return func(c *config) { c.agent = command } }

// interfaceName matches a Linux network interface name (at most 15 bytes, no slash or space).
var interfaceName = regexp.MustCompile(`^[A-Za-z0-9_.:@-]{1,15}$`)

// networkParts splits and checks WithNetwork's value, and says whether every part is an interface name.
func networkParts(network string) (parts []string, interfacesOnly bool, err error) {
	interfacesOnly = true
	for _, p := range strings.Split(network, ",") {
		p = strings.TrimSpace(p)
		if strings.Contains(p, "/") {
			prefix, err := netip.ParsePrefix(p)
			if err != nil {
				return nil, false, fmt.Errorf("launch: network %q: %q is not a subnet (CIDR such as 10.0.0.0/24): %v", network, p, err)
			}
			if prefix.Masked() != prefix {
				return nil, false, fmt.Errorf("launch: network %q: %q has host bits set: the subnet is %s", network, p, prefix.Masked())
			}
			interfacesOnly = false
		} else if !interfaceName.MatchString(p) {
			return nil, false, fmt.Errorf("launch: network %q: %q is neither a subnet (CIDR such as 10.0.0.0/24) nor an "+
				"interface name (such as eth0)", network, p)
		}
		parts = append(parts, p)
	}
	return parts, interfacesOnly, nil
}

// localInterfaces lists this machine's network interfaces and their addresses (net.Interfaces; tests
// replace it).
var localInterfaces = func() ([]localInterface, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := make([]localInterface, 0, len(ifaces))
	for _, iface := range ifaces {
		li := localInterface{name: iface.Name}
		addrs, err := iface.Addrs()
		if err != nil {
			return nil, fmt.Errorf("interface %s: %w", iface.Name, err)
		}
		for _, a := range addrs {
			if prefix, err := netip.ParsePrefix(a.String()); err == nil {
				li.addrs = append(li.addrs, prefix)
			}
		}
		out = append(out, li)
	}
	return out, nil
}

// localInterface is a network interface of this machine and its addresses.
type localInterface struct {
	name  string
	addrs []netip.Prefix // address and prefix length: 10.0.0.5/24
}

func (li localInterface) String() string {
	if len(li.addrs) == 0 {
		return li.name + " (no address)"
	}
	addrs := make([]string, len(li.addrs))
	for i, a := range li.addrs {
		addrs[i] = a.String()
	}
	return li.name + " (" + strings.Join(addrs, ", ") + ")"
}

// checkLocalNetwork refuses a WithNetwork value of which no part is on this machine: an interface name it
// does not have, or a subnet that none of its addresses is in. mpirun runs here, and Open MPI makes its own
// control connections (oob_tcp_if_include) on that network: without it, mpirun stops with banners ("None
// of the TCP networks specified to be included for out-of-band communications could be found"). One part
// found is enough, as for Open MPI: the other hosts may be reached through the others.
func checkLocalNetwork(network string) error {
	parts, _, err := networkParts(network)
	if err != nil {
		return err
	}
	ifaces, err := localInterfaces()
	if err != nil {
		return fmt.Errorf("launch: network %q: listing this machine's interfaces: %w", network, err)
	}
	for _, p := range parts {
		prefix, perr := netip.ParsePrefix(p)
		for _, li := range ifaces {
			if perr != nil && li.name == p {
				return nil
			}
			if perr == nil && slices.ContainsFunc(li.addrs, func(a netip.Prefix) bool { return prefix.Contains(a.Addr()) }) {
				return nil
			}
		}
	}
	var what string
	switch {
	case len(parts) > 1:
		what = "none of these interfaces or subnets"
	case strings.Contains(parts[0], "/"):
		what = "no address in this subnet"
	default:
		what = "no interface of this name"
	}
	names := make([]string, len(ifaces))
	for i, li := range ifaces {
		names[i] = li.String()
	}
	return fmt.Errorf("launch: network %q: this machine has %s, and mpirun, which runs here, makes its control "+
		"connections on it (oob_tcp_if_include); its interfaces are %s", network, what, strings.Join(names, ", "))
}
