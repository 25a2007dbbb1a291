package prepare

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // the graph's node types read best unqualified

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
)

// optimizerStateCopies is how many copies of the parameters an optimizer may keep: Adam keeps two moments.
const optimizerStateCopies = 2

// checkMemory estimates the memory the model holds once its variables are initialised — every variable
// the probe created (parameters and gradient accumulators), plus up to optimizerStateCopies copies of the
// parameters for each optimizer — and refuses a model that does not fit in the memory this machine has
// available, counting the limits of its cgroups and sharing it with the job's other processes on this
// machine. Initialising it anyway ends the process with Go's "fatal error: out of memory", which no
// error handling can catch. Where the available memory is unknown, it checks nothing.
func (m *Model) checkMemory() error {
	var vars, params float64
	for v := range m.ctx.IterVariables() {
		bytes := float64(v.Shape().Memory())
		vars += bytes
		if v.Trainable {
			params += bytes
		}
	}
	state := vars + float64(len(m.onMaterialize)*optimizerStateCopies)*params
	need := state + m.activationBytes
	sharing := processesSharingMemory(m.rt.Comm)
	available, ok := availableMemory("/", sharing)
	if !ok || need <= float64(available) {
		return nil
	}
	where := "on this machine"
	if sharing > 1 {
		where = fmt.Sprintf("to each of the %d processes on this machine", sharing)
	}
	batch := 0
	if len(m.firstInputs) > 0 && m.firstInputs[0].Rank() > 0 {
		batch = m.firstInputs[0].Dimensions[0]
	}
	return fmt.Errorf("prepare: the model needs about %s — %s for its parameters (%s), gradient accumulators and "+
		"optimizer state, and %s for the activations and gradients of one micro-batch of %d examples — more than "+
		"the %s of memory available %s: use a smaller batch per process (or more processes, or "+
		"gradient accumulation), or a smaller model", byteSize(need), byteSize(state), byteSize(params),
		byteSize(m.activationBytes), batch, byteSize(float64(available)), where)
}

// peakLiveBytes estimates the memory a training step's intermediate values need at their peak, as the
// pure-Go backend runs a graph: one node after the other in the order they were built, each output alive
// from its node until its last consumer ran, parameters and variables not counted (they are the batch and
// the model's state). An element-wise node may write into an input it is the last user of; counting it
// anyway makes this an upper bound of that backend's need, and close to it: a job refused here would have
// ended in Go's "fatal error: out of memory", which no error handling can catch.
//
// The kernels' own memory is added: goaccel's convolution executors take patches and padded copies from a
// pool that keeps them for the next step (cpu.ScratchBytes), as much as the activations for a CNN at a
// large batch (the CNN at 10,000 examples per batch was estimated at 2.5 GiB without them, and used 3.5).
func peakLiveBytes(g *Graph, outputs []*Node) float64 {
	return valuesPeakBytes(g, outputs) + float64(cpu.ScratchBytes(g))
}

// valuesPeakBytes is the peak of the graph's own intermediate values.
func valuesPeakBytes(g *Graph, outputs []*Node) float64 {
	nodes := g.Nodes()
	lastUse := make(map[*Node]int, len(nodes))
	for i, n := range nodes {
		for _, in := range n.Inputs() {
			lastUse[in] = i
		}
	}
	for _, out := range outputs {
		lastUse[out] = len(nodes) // kept until the step returns
	}
	var live, peak float64
	freeAt := make(map[int][]float64)
	for i, n := range nodes {
		// A node with several outputs (RNGBitGenerator, the random bits of dropout and its new state) has no
		// shape of its own (Shape is invalid, and its Memory panics): the split nodes after it hold its
		// outputs, and are counted.
		if n.Type() != NodeTypeParameter && n.Type() != NodeTypeConstant && n.NumOutputs() == 1 {
			if _, used := lastUse[n]; used {
				bytes := float64(n.Shape().Memory())
				live += bytes
				freeAt[lastUse[n]] = append(freeAt[lastUse[n]], bytes)
			}
		}
		peak = max(peak, live)
		for _, bytes := range freeAt[i] {
			live -= bytes
		}
	}
	return peak
}

// availableMemory is the memory this process can still allocate: the machine's MemAvailable, or less if
// the cgroups the process runs in leave less, divided among the processes of the job that share this
// machine (they all start at once and each reads the same MemAvailable before any of them allocates).
// root is "/" but in tests.
func availableMemory(root string, sharing int) (uint64, bool) {
	available, ok := memAvailable(filepath.Join(root, "proc/meminfo"))
	if left, limited := cgroupMemoryLeft(root); limited && (!ok || left < available) {
		available, ok = left, true
	}
	return available / uint64(max(1, sharing)), ok
}

// cgroupMemoryLeft is what the memory cgroups of this process leave it: the least of limit − usage over
// its cgroup and every ancestor, for cgroup v2 (memory.max, memory.current) and v1
// (memory.limit_in_bytes, memory.usage_in_bytes). A job started under `systemd-run -p MemoryMax=2G` or a
// container's limit is otherwise killed by the kernel (exit 137) without a word. limited is false when no
// cgroup sets a limit.
func cgroupMemoryLeft(root string) (left uint64, limited bool) {
	data, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		hierarchy, rest, ok1 := strings.Cut(line, ":")
		controllers, path, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 || !strings.HasPrefix(path, "/") {
			continue
		}
		var base, limitFile, usageFile string
		switch {
		case hierarchy == "0" && controllers == "":
			base, limitFile, usageFile = "sys/fs/cgroup", "memory.max", "memory.current"
		case slices.Contains(strings.Split(controllers, ","), "memory"):
			base, limitFile, usageFile = "sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
		default:
			continue
		}
		// Inside a cgroup namespace the mount's root is the process's own cgroup, and path may not exist
		// below it: the walk up reaches the mount's root, which is then the process's cgroup.
		for dir := path; ; dir = filepath.Dir(dir) {
			full := filepath.Join(root, base, dir)
			if limit, ok := readUint(filepath.Join(full, limitFile)); ok {
				usage, _ := readUint(filepath.Join(full, usageFile))
				l := uint64(0)
				if limit > usage {
					l = limit - usage
				}
				if !limited || l < left {
					left, limited = l, true
				}
			}
			if dir == "/" {
				break
			}
		}
	}
	return left, limited
}

// readUint reads a cgroup file holding one number; "max" (no limit) and anything else are not a number.
func readUint(path string) (uint64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	return n, err == nil
}

// processesSharingMemory is how many processes of the job draw on this machine's memory: every rank of an
// in-process group (goroutine ranks share one process), else the launcher's local size.
func processesSharingMemory(comm *backends.Communicator) int {
	if comm != nil && comm.Name() == backends.InProcessEngine {
		return comm.Size()
	}
	if topo, err := backends.DetectTopology(); err == nil && topo.LocalSize > 0 {
		return topo.LocalSize
	}
	return 1
}

func memAvailable(path string) (uint64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			return kb * 1024, err == nil
		}
	}
	return 0, false
}

func byteSize(b float64) string {
	for _, unit := range []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"} {
		if b < 1024 || unit == "PiB" {
			return fmt.Sprintf("%.1f %s", b, unit)
		}
		b /= 1024
	}
	return ""
}
