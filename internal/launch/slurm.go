package launch

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// inSlurm reports whether the launcher runs inside a Slurm allocation (salloc, sbatch).
func (c *config) inSlurm() bool {
	_, ok := c.lookupEnv("SLURM_JOB_ID")
	return ok
}

// SlurmHosts returns the hosts of the Slurm allocation described by environ (NAME=VALUE pairs, as
// os.Environ), or nil when environ is not inside one (SLURM_JOB_ID unset). The names come from
// SLURM_JOB_NODELIST, expanded by `scontrol show hostnames` when scontrol is on PATH and by ExpandNodeList
// otherwise; each host's slots from SLURM_TASKS_PER_NODE ("4(x2),2"), else SLURM_NTASKS_PER_NODE, else 1.
// Run and Argv use them when no hosts or hostfile are given.
func SlurmHosts(environ []string) ([]Host, error) {
	c := &config{environ: environ}
	if !c.inSlurm() {
		return nil, nil
	}
	list, ok := c.lookupEnv("SLURM_JOB_NODELIST")
	if !ok {
		list, ok = c.lookupEnv("SLURM_NODELIST")
	}
	if !ok || list == "" {
		return nil, errors.New("launch: SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not: the allocation's hosts are unknown " +
			"(give --hosts or a hostfile)")
	}
	names, err := slurmHostnames(list)
	if err != nil {
		return nil, err
	}
	slots := make([]int, len(names))
	for i := range slots {
		slots[i] = 1
	}
	for _, name := range []string{"SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"} {
		value, ok := c.lookupEnv(name)
		if !ok || value == "" {
			continue
		}
		counts, err := ExpandTasksPerNode(value)
		if err != nil {
			return nil, fmt.Errorf("launch: %s: %w", name, err)
		}
		switch len(counts) {
		case len(names):
			slots = counts
		case 1: // --ntasks-per-node=4: the same on every node
			for i := range slots {
				slots[i] = counts[0]
			}
		default:
			return nil, fmt.Errorf("launch: %s=%s gives %d nodes' task counts, but SLURM_JOB_NODELIST=%s has %d nodes",
				name, value, len(counts), list, len(names))
		}
		break
	}
	hosts := make([]Host, len(names))
	for i, name := range names {
		hosts[i] = Host{Name: name, Slots: slots[i]}
	}
	return hosts, nil
}

// slurmHostnames expands a Slurm node list with scontrol where there is one (it knows every form Slurm
// writes), else with ExpandNodeList.
func slurmHostnames(list string) ([]string, error) {
	scontrol, err := exec.LookPath("scontrol")
	if err != nil {
		return ExpandNodeList(list)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, scontrol, "show", "hostnames", list).Output()
	if err != nil {
		return nil, fmt.Errorf("launch: scontrol show hostnames %s: %w", list, err)
	}
	names := strings.Fields(string(out))
	if len(names) == 0 {
		return nil, fmt.Errorf("launch: scontrol show hostnames %s printed no host", list)
	}
	if len(names) > maxListEntries {
		return nil, fmt.Errorf("launch: scontrol show hostnames %s printed more than %d hosts", list, maxListEntries)
	}
	for _, name := range names {
		if err := checkHostName(name); err != nil {
			return nil, fmt.Errorf("%w (printed by scontrol show hostnames %s)", err, list)
		}
	}
	return names, nil
}

// maxListEntries bounds what a host list may expand to: the names of a Slurm node list, the counts of a
// task list, the hosts of a hostfile. The largest machines have tens of thousands of nodes; a compact form
// that claims more ("n[0-99999][0-99999]", "1(x1000000000000)") is a typo or garbage, and expanding it
// would exhaust memory, or start a probe process per name, before anything could say so. The count is
// computed before anything is allocated.
const maxListEntries = 1 << 20

// ExpandNodeList expands Slurm's compact node list ("node[1-3,5],gpu-a[01-02]b") into host names
// ("node1", "node2", "node3", "node5", "gpu-a01b", "gpu-a02b"), as `scontrol show hostnames` does: ranges
// keep the zero padding of their first number, and several bracket groups in one name multiply. Every
// name must be a host name as --hosts takes it (never one starting with '-'), and a list of more than
// 1048576 names is refused before it is expanded.
func ExpandNodeList(list string) ([]string, error) {
	var items []nodePattern
	total := 0
	depth, start := 0, 0
	for i := 0; i <= len(list); i++ {
		if i < len(list) {
			switch list[i] {
			case '[':
				depth++
				continue
			case ']':
				depth--
				if depth < 0 {
					return nil, fmt.Errorf("launch: node list %q: unbalanced ']'", list)
				}
				continue
			case ',':
				if depth > 0 {
					continue
				}
			default:
				continue
			}
		}
		if depth != 0 {
			return nil, fmt.Errorf("launch: node list %q: unbalanced '['", list)
		}
		item := strings.TrimSpace(list[start:i])
		start = i + 1
		if item == "" {
			return nil, fmt.Errorf("launch: node list %q has an empty name", list)
		}
		p, err := parseNodePattern(item)
		if err != nil {
			return nil, fmt.Errorf("launch: node list %q: %w", list, err)
		}
		// The names of a pattern differ in digits only, which a host name may hold anywhere: the first name
		// is a host name exactly when all are.
		if err := checkHostName(p.first()); err != nil {
			return nil, fmt.Errorf("%w (in node list %q)", err, list)
		}
		if total += p.count; total > maxListEntries {
			return nil, fmt.Errorf("launch: node list %q names more than %d hosts", list, maxListEntries)
		}
		items = append(items, p)
	}
	names := make([]string, 0, total)
	for _, p := range items {
		names = p.expand(names)
	}
	return names, nil
}

// nodePattern is one name of a node list: parts[0] + a number of groups[0] + parts[1] + ... The first
// group varies slowest.
type nodePattern struct {
	parts  []string
	groups [][]nodeRange
	count  int // the names it expands to, at most maxListEntries+1
}

// nodeRange is LOW-HIGH, or one number (LOW == HIGH), of a bracket group; width is LOW's digits, kept as
// zero padding.
type nodeRange struct{ lo, hi, width int }

// parseNodePattern reads one name of a node list and counts its names, without expanding them.
func parseNodePattern(item string) (nodePattern, error) {
	p := nodePattern{count: 1}
	rest := item
	for {
		open := strings.IndexByte(rest, '[')
		if open < 0 {
			if strings.Contains(rest, "]") {
				return p, fmt.Errorf("%q: unbalanced ']'", item)
			}
			p.parts = append(p.parts, rest)
			return p, nil
		}
		closing := strings.IndexByte(rest[open:], ']')
		if closing < 0 {
			return p, fmt.Errorf("%q: unbalanced '['", item)
		}
		prefix, ranges := rest[:open], rest[open+1:open+closing]
		if strings.Contains(prefix, "]") {
			return p, fmt.Errorf("%q: unbalanced ']'", item)
		}
		rest = rest[open+closing+1:]
		var group []nodeRange
		size := 0
		for _, r := range strings.Split(ranges, ",") {
			from, to, isRange := strings.Cut(r, "-")
			if !isRange {
				to = from
			}
			lo, err1 := strconv.Atoi(from)
			hi, err2 := strconv.Atoi(to)
			if err1 != nil || err2 != nil || !isDigits(from) || !isDigits(to) || hi < lo {
				return p, fmt.Errorf("%q: %q is not a number or a range LOW-HIGH", item, r)
			}
			// hi-lo cannot overflow: both are at least 0.
			if hi-lo >= maxListEntries || size+hi-lo+1 > maxListEntries {
				return p, fmt.Errorf("%q names more than %d hosts", item, maxListEntries)
			}
			size += hi - lo + 1
			group = append(group, nodeRange{lo: lo, hi: hi, width: len(from)})
		}
		// Both factors are at most maxListEntries+1, so the product fits an int before it is capped.
		p.count = min(p.count*size, maxListEntries+1)
		p.parts = append(p.parts, prefix)
		p.groups = append(p.groups, group)
	}
}

// first is the pattern's first name.
func (p nodePattern) first() string {
	var b strings.Builder
	for g, part := range p.parts {
		b.WriteString(part)
		if g < len(p.groups) {
			fmt.Fprintf(&b, "%0*d", p.groups[g][0].width, p.groups[g][0].lo)
		}
	}
	return b.String()
}

// expand appends the pattern's names to names.
func (p nodePattern) expand(names []string) []string {
	// numbers[g] are group g's numbers as names hold them, zero-padded.
	numbers := make([][]string, len(p.groups))
	for g, group := range p.groups {
		for _, r := range group {
			for n := r.lo; n <= r.hi; n++ {
				numbers[g] = append(numbers[g], fmt.Sprintf("%0*d", r.width, n))
			}
		}
	}
	var name []byte
	var walk func(g int)
	walk = func(g int) {
		name = append(name, p.parts[g]...)
		if g == len(p.groups) {
			names = append(names, string(name))
		} else {
			prefix := len(name)
			for _, number := range numbers[g] {
				name = append(name[:prefix], number...)
				walk(g + 1)
			}
		}
	}
	walk(0)
	return names
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// ExpandTasksPerNode expands Slurm's compressed task counts ("4(x2),2") into one count per node
// ([4 4 2]). Each count is from 1 to 1048576, and a list of more than 1048576 nodes' counts is refused
// before it is expanded.
func ExpandTasksPerNode(value string) ([]int, error) {
	type run struct{ n, times int }
	var runs []run
	total := 0
	for _, part := range strings.Split(value, ",") {
		number, repeat := part, "1"
		if i := strings.IndexByte(part, '('); i >= 0 {
			if !strings.HasPrefix(part[i:], "(x") || !strings.HasSuffix(part, ")") {
				return nil, fmt.Errorf("%q: %q is not N or N(xM)", value, part)
			}
			number, repeat = part[:i], part[i+2:len(part)-1]
		}
		n, err1 := strconv.Atoi(number)
		times, err2 := strconv.Atoi(repeat)
		switch {
		case !isDigits(number) || !isDigits(repeat) || err1 == nil && n < 1 || err2 == nil && times < 1:
			return nil, fmt.Errorf("%q: %q is not N or N(xM) with N, M at least 1", value, part)
		case err1 != nil || n > maxSlots: // only digits: the number is too large
			return nil, fmt.Errorf("%q: %q: a node runs at most %d tasks", value, part, maxSlots)
		case err2 != nil || times > maxListEntries-total:
			return nil, fmt.Errorf("%q gives more than %d nodes' task counts", value, maxListEntries)
		}
		total += times
		runs = append(runs, run{n, times})
	}
	counts := make([]int, 0, total)
	for _, r := range runs {
		for range r.times {
			counts = append(counts, r.n)
		}
	}
	return counts, nil
}
