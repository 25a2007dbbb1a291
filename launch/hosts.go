package launch

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// Host is a machine of a job and the number of processes it takes (its slots), as mpirun's --host
// node1:4 names them.
type Host struct {
	Name  string
	Slots int
}

// String is the host as mpirun's --host takes it: "node1:4".
func (h Host) String() string { return h.Name + ":" + strconv.Itoa(h.Slots) }

// hostName matches what may name a host: a hostname (letters, digits, '-', '.', '_') or an IPv4 address.
// IPv6 addresses are left out: their colons cannot be told from the slots' in mpirun's --host.
var hostName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)

// maxSlots bounds the slots of one host (and the task count of one Slurm node): no machine runs a million
// processes of one job, and a count beyond it is a typo or garbage, which must not become an mpirun -np
// or a sum of slots that overflows.
const maxSlots = 1 << 20

// ParseHosts reads a host list as `accel launch --hosts` takes it: comma-separated NAME or NAME:SLOTS, slots
// 1 when left out ("node1:4,node2:4", "a,b,c"). A name may appear once.
func ParseHosts(spec string) ([]Host, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, errors.New("launch: empty host list: write NAME[:SLOTS],... (node1:4,node2:4)")
	}
	var hosts []Host
	seen := map[string]bool{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		name, slotsText, hasSlots := strings.Cut(item, ":")
		h := Host{Name: name, Slots: 1}
		if hasSlots {
			n, err := strconv.Atoi(slotsText)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("launch: host %q in %q: slots must be a whole number of at least 1, got %q",
					name, spec, slotsText)
			}
			h.Slots = n
		}
		if err := checkHostName(name); err != nil {
			return nil, fmt.Errorf("%w (in %q)", err, spec)
		}
		if seen[name] {
			return nil, fmt.Errorf("launch: host %q appears twice in %q: give it once, with all its slots", name, spec)
		}
		seen[name] = true
		hosts = append(hosts, h)
	}
	return hosts, nil
}

func checkHostName(name string) error {
	if !hostName.MatchString(name) {
		return fmt.Errorf("launch: %q is not a host name (letters, digits, '-', '.', '_') or an IPv4 address", name)
	}
	return nil
}

// totalSlots is the number of processes the hosts take.
func totalSlots(hosts []Host) int {
	n := 0
	for _, h := range hosts {
		n += h.Slots
	}
	return n
}

// hostList is the value of mpirun's --host (Open MPI) or -hosts (MPICH): "node1:4,node2:4".
func hostList(hosts []Host) string {
	parts := make([]string, len(hosts))
	for i, h := range hosts {
		parts[i] = h.String()
	}
	return strings.Join(parts, ",")
}

// WithHosts runs the processes on hosts (mpirun --host node1:4,node2:4), each taking at most its slots;
// mpirun fills each host's slots in turn, so ranks 0-3 run on node1 and 4-7 on node2. With hosts, a
// process count of 0 means one process per slot, a larger count than the slots is an error (Open MPI
// refuses it: "not enough slots"), and goaccel never adds --oversubscribe.
func WithHosts(hosts ...Host) Option { return func(c *config) { c.hosts = append(c.hosts, hosts...) } }

// hostfileHosts reads the host names of an Open MPI or MPICH hostfile: the first word of every line that is
// not blank or a comment ("node1 slots=4", "node2:4", "# rack 2").
func hostfileHosts(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("launch: hostfile: %w", err)
	}
	defer f.Close()
	var names []string
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		line, _, _ := strings.Cut(scanner.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		name, _, _ := strings.Cut(fields[0], ":")
		names = append(names, name)
	}
	if err := scanner.Err(); err != nil {
		return nil, fmt.Errorf("launch: hostfile %s: %w", path, err)
	}
	return names, nil
}
