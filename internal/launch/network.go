package launch

import (
	"fmt"
	"net/netip"
	"regexp"
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
