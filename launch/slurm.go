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
	return names, nil
}

// ExpandNodeList expands Slurm's compact node list ("node[1-3,5],gpu-a[01-02]b") into host names
// ("node1", "node2", "node3", "node5", "gpu-a01b", "gpu-a02b"), as `scontrol show hostnames` does: ranges
// keep the zero padding of their first number, and several bracket groups in one name multiply.
func ExpandNodeList(list string) ([]string, error) {
	var names []string
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
		expanded, err := expandNodeName(item)
		if err != nil {
			return nil, fmt.Errorf("launch: node list %q: %w", list, err)
		}
		names = append(names, expanded...)
	}
	return names, nil
}

// expandNodeName expands the bracket groups of one name, the first group outermost.
func expandNodeName(item string) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.ContainsAny(item, "]") {
			return nil, fmt.Errorf("%q: unbalanced ']'", item)
		}
		return []string{item}, nil
	}
	closing := strings.IndexByte(item[open:], ']')
	if closing < 0 {
		return nil, fmt.Errorf("%q: unbalanced '['", item)
	}
	prefix, ranges, rest := item[:open], item[open+1:open+closing], item[open+closing+1:]
	tails, err := expandNodeName(rest)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, r := range strings.Split(ranges, ",") {
		from, to, isRange := strings.Cut(r, "-")
		if !isRange {
			to = from
		}
		lo, err1 := strconv.Atoi(from)
		hi, err2 := strconv.Atoi(to)
		if err1 != nil || err2 != nil || from == "" || to == "" || lo < 0 || hi < lo {
			return nil, fmt.Errorf("%q: %q is not a number or a range LOW-HIGH", item, r)
		}
		if hi-lo > 100000 {
			return nil, fmt.Errorf("%q: range %q is too large", item, r)
		}
		for n := lo; n <= hi; n++ {
			number := fmt.Sprintf("%0*d", len(from), n)
			for _, tail := range tails {
				names = append(names, prefix+number+tail)
			}
		}
	}
	return names, nil
}

// ExpandTasksPerNode expands Slurm's compressed task counts ("4(x2),2") into one count per node
// ([4 4 2]).
func ExpandTasksPerNode(value string) ([]int, error) {
	var counts []int
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
		if err1 != nil || err2 != nil || n < 1 || times < 1 {
			return nil, fmt.Errorf("%q: %q is not N or N(xM) with N, M at least 1", value, part)
		}
		for range times {
			counts = append(counts, n)
		}
	}
	return counts, nil
}
