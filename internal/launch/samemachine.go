package launch

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Several host names of a job may be this machine: "localhost" and "127.0.0.1", its name and its address,
// or loopback addresses (127.0.0.2, ...) named to try a job "on several hosts" on one machine before
// renting them. Open MPI's mpirun treats them in two ways:
//
//   - a name it takes for itself (localhost, this machine's name, a name of one of its interfaces'
//     addresses) is merged with every other such name: their processes run as one host, under mpirun, and
//     no daemon is started through the launch agent. The job runs, silently, as on one host.
//   - any other name gets its own daemon, started through the launch agent, even when that name is this
//     machine (127.0.0.2, or any name with an agent that runs the command here). Two daemons on one machine
//     break Open MPI's shared-memory transport (vader): each numbers its processes from 0, the two
//     processes numbered 0 map the same segment, and a rank dies with SIGSEGV in MPI_Comm_dup or the first
//     collective. Their processes must talk over TCP instead.
//
// The launcher says which names are this machine (WithNotice), and in the second case chooses the
// transports that work (sameMachineMCA).

// hostPlace says whether a host name is this machine, and whether mpirun takes it for itself (see above).
type hostPlace struct {
	here, mpirunSelf bool
}

// placeHost finds where a host name is (placeOf; tests replace it).
var placeHost = placeOf

// placeOf resolves name as Open MPI 4 does to decide whether a host is its own (opal_ifislocal: an address
// of the name is one of the interfaces' addresses; "localhost" and the hostname, short or full, too), and
// says besides whether any address of the name is a loopback one, which is this machine whatever mpirun
// thinks.
func placeOf(name string) hostPlace {
	if name == "localhost" {
		return hostPlace{here: true, mpirunSelf: true}
	}
	if self, err := os.Hostname(); err == nil {
		short, _, _ := strings.Cut(self, ".")
		if name == self || name == short {
			return hostPlace{here: true, mpirunSelf: true}
		}
	}
	var ips []net.IP
	if ip := net.ParseIP(name); ip != nil {
		ips = []net.IP{ip}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, name)
		if err != nil {
			return hostPlace{}
		}
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	}
	var local []net.IP
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipnet, ok := a.(*net.IPNet); ok {
				local = append(local, ipnet.IP)
			}
		}
	}
	var p hostPlace
	for _, ip := range ips {
		if slices.ContainsFunc(local, ip.Equal) {
			return hostPlace{here: true, mpirunSelf: true}
		}
		p.here = p.here || ip.IsLoopback()
	}
	return p
}

// sameMachine is what the job's named hosts are to this machine.
type sameMachine struct {
	// here are the names that are this machine, in the job's order; merged those of them mpirun takes for
	// itself; daemons the names mpirun starts a daemon for on this machine.
	here, merged, daemons []string
	// slots of the names that are this machine.
	slots map[string]int
	// all: every host of the job is this machine.
	all bool
}

// places is the number of Open MPI nodes (mpirun, daemons) that run processes on this machine.
func (s *sameMachine) places() int {
	n := len(s.daemons)
	if len(s.merged) > 0 {
		n++
	}
	return n
}

// machineMemo keeps what was found about the job's hosts, once per job (it resolves names), and whether
// it was told.
type machineMemo struct {
	once     sync.Once
	found    *sameMachine
	noticed  sync.Once
	noticeFn func(string)
}

// namedHosts are the hosts the job names: WithHosts's or the Slurm allocation's (hosts), else the
// hostfile's when it can be read.
func (c *config) namedHosts(hosts []Host) []Host {
	if len(hosts) == 0 && c.hostfile != "" {
		hosts, _ = readHostfile(c.hostfile)
	}
	return hosts
}

// sameMachine finds which of the job's hosts are this machine (nil when fewer than two are), resolving each
// name once per job, at once.
func (c *config) sameMachine(hosts []Host) *sameMachine {
	c.memo.once.Do(func() {
		hosts = c.namedHosts(hosts)
		if len(hosts) < 2 {
			return
		}
		places := make([]hostPlace, len(hosts))
		var wg sync.WaitGroup
		limit := make(chan struct{}, 16)
		for i, h := range hosts {
			wg.Go(func() {
				limit <- struct{}{}
				defer func() { <-limit }()
				places[i] = placeHost(h.Name)
			})
		}
		wg.Wait()
		s := &sameMachine{slots: map[string]int{}, all: true}
		for i, h := range hosts {
			p := places[i]
			s.all = s.all && p.here
			if !p.here {
				continue
			}
			if _, seen := s.slots[h.Name]; !seen {
				s.here = append(s.here, h.Name)
				if p.mpirunSelf {
					s.merged = append(s.merged, h.Name)
				} else {
					s.daemons = append(s.daemons, h.Name)
				}
			}
			s.slots[h.Name] += h.Slots
		}
		if len(s.here) >= 2 {
			c.memo.found = s
		}
	})
	return c.memo.found
}

// loopbackNetwork is the network the processes of a job whose hosts are all this machine talk on: every
// machine has it, and Open MPI's TCP transport leaves it out by default (btl_tcp_if_exclude).
const loopbackNetwork = "127.0.0.0/8"

// sameMachineMCA are the MCA parameters a job needs whose processes run under two or more Open MPI nodes
// of this machine (see the top of this file), unless the user decided them: the TCP transport instead of
// shared memory (btl=self,tcp), and, when every host is this machine and no network was chosen, the
// loopback network for the TCP transport and mpirun's control connections.
func (c *config) sameMachineMCA(hosts []Host) []MCAParam {
	s := c.sameMachine(hosts)
	if s == nil || s.places() < 2 {
		return nil
	}
	var out []MCAParam
	if !c.userSetsMCA("btl") {
		out = append(out, MCAParam{Name: "btl", Value: "self,tcp", Why: "two Open MPI daemons of one machine cannot " +
			"share memory: their processes talk over TCP"})
	}
	if s.all && c.network == "" {
		for _, name := range []string{"btl_tcp_if_include", "oob_tcp_if_include"} {
			prefix, _, _ := strings.Cut(name, "_if_")
			if !c.userSetsMCA(name) && !c.userSetsMCA(prefix+"_if_exclude") {
				out = append(out, MCAParam{Name: name, Value: loopbackNetwork, Why: "every host is this machine: " +
					"the loopback network is the one they surely share"})
			}
		}
	}
	return out
}

// userSetsMCA reports whether the user decided the MCA parameter name: with WithMCA, among the extra
// mpirun arguments, or with an OMPI_MCA_* variable.
func (c *config) userSetsMCA(name string) bool {
	return slices.ContainsFunc(c.mca, func(p MCAParam) bool { return p.Name == name }) || c.extraSetsMCA(name) ||
		c.env("OMPI_MCA_"+name) != ""
}

// WithNotice calls fn with each notice about the job, once per job, before it starts (and from Argv):
// today, that several of its hosts are this machine, and what that changes. By default Run writes each
// notice, after "launch: ", to the job's standard error.
func WithNotice(fn func(notice string)) Option { return func(c *config) { c.memo.noticeFn = fn } }

// notify tells the job's notices, once.
func (c *config) notify(hosts []Host) {
	c.memo.noticed.Do(func() {
		for _, n := range c.notices(hosts) {
			switch {
			case c.memo.noticeFn != nil:
				c.memo.noticeFn(n)
			case c.stderr != nil:
				fmt.Fprintf(c.stderr, "launch: %s\n", n)
			}
		}
	})
}

// notices are the job's notices (see WithNotice).
func (c *config) notices(hosts []Host) []string {
	s := c.sameMachine(hosts)
	if s == nil || c.flavor != OpenMPI {
		return nil
	}
	self, _ := os.Hostname()
	names := quotedList(s.here) + " all name"
	if len(s.here) == 2 {
		names = quotedList(s.here) + " both name"
	}
	if s.places() < 2 {
		n := 0
		for _, name := range s.merged {
			n += s.slots[name]
		}
		return []string{fmt.Sprintf("hosts %s this machine (%s), and mpirun takes each for itself: it runs "+
			"their processes (%d slots) as one host, and starts no daemon through the launch agent. To try the job "+
			"on several hosts on this machine, name them by loopback addresses mpirun does not take for itself "+
			"(--hosts 127.0.0.2:2,127.0.0.3:2) and give a --launch-agent that runs the command here "+
			"(docs/launching.md, \"Several hosts on one machine\")", names, self, n)}
	}
	if c.userSetsMCA("btl") {
		return []string{fmt.Sprintf("hosts %s this machine (%s), and mpirun starts a daemon for %s: Open MPI's "+
			"shared memory cannot join the processes of two daemons of one machine, and you chose the transports "+
			"(btl %s): with a shared-memory one among them (vader, sm) a rank may crash with SIGSEGV; "+
			"--mca btl self,tcp works", names, self, placesOf(s), c.mcaValue("btl"))}
	}
	params := c.sameMachineMCA(hosts)
	words := make([]string, len(params))
	for i, p := range params {
		words[i] = "--mca " + p.Name + " " + p.Value
	}
	return []string{fmt.Sprintf("hosts %s this machine (%s), and mpirun starts a daemon for %s: Open MPI's "+
		"shared memory cannot join the processes of two daemons of one machine (a rank would crash with SIGSEGV), "+
		"so they talk over TCP (%s)", names, self, placesOf(s), strings.Join(words, " "))}
}

// placesOf names the Open MPI nodes of this machine: "127.0.0.2 and 127.0.0.3", or "localhost (mpirun
// itself) and 127.0.0.2".
func placesOf(s *sameMachine) string {
	var parts []string
	if len(s.merged) > 0 {
		parts = append(parts, strings.Join(s.merged, ", ")+" (mpirun itself)")
	}
	parts = append(parts, s.daemons...)
	if len(parts) > 1 {
		return "each of " + strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
	}
	return parts[0]
}

// quotedList writes names as "a and b" or "a, b and c".
func quotedList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// mcaValue is the value the user gave the MCA parameter name (WithMCA, the extra arguments, or the
// environment, in that order).
func (c *config) mcaValue(name string) string {
	for _, p := range slices.Backward(c.mca) {
		if p.Name == name {
			return p.Value
		}
	}
	for i, a := range c.extra {
		if (a == "--mca" || a == "-mca" || a == "--gmca" || a == "-gmca") && i+2 < len(c.extra) && c.extra[i+1] == name {
			return c.extra[i+2]
		}
	}
	return c.env("OMPI_MCA_" + name)
}
