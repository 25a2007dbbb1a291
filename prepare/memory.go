package prepare

import (
	"bufio"
	"errors"
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

// ErrOutOfMemory matches (errors.Is) a refusal to build a model whose training step would not fit in the
// memory of a process: Materialize, and so the first Backward, return a *MemoryError wrapping it before
// anything is allocated. A program can then retry with a smaller batch (accel.FindExecutableBatchSize does).
var ErrOutOfMemory = errors.New("out of memory")

// MemoryError is the refusal of a model whose estimated need is more than a process has. Every process
// returns it together (the check is collective), describing the first process that lacks memory, and holds
// every process's estimate so that Fits can tell which smaller batch would pass.
type MemoryError struct {
	// Rank is the first process that lacks memory; Batch the micro-batch size the estimate is for.
	Rank, Batch int
	// Need, State and Activations estimate that process's need in bytes: State for the variables,
	// gradient accumulators and optimizer state, Activations for one micro-batch's intermediate values;
	// Available is the memory it has.
	Need, State, Activations, Available float64

	who, where string
	params     float64
	ranks      []memoryNeed
}

// memoryNeed is one process's estimate, as the processes exchange it.
type memoryNeed struct {
	state, activations, available float64 // available < 0: unknown
}

func (e *MemoryError) Error() string {
	return fmt.Sprintf("prepare: the model needs about %s%s — %s for its parameters (%s), gradient "+
		"accumulators and optimizer state, and %s for the activations and gradients of one micro-batch of %d "+
		"examples — more than the %s of memory available %s: use a smaller batch per process (or more processes, or "+
		"gradient accumulation), or a smaller model", byteSize(e.Need), e.who, byteSize(e.State),
		byteSize(e.params), byteSize(e.Activations), e.Batch, byteSize(e.Available), e.where)
}

// Unwrap makes the refusal match ErrOutOfMemory.
func (e *MemoryError) Unwrap() error { return ErrOutOfMemory }

// Fits reports whether a micro-batch of batch examples would pass the check on every process, taking the
// activations as proportional to the batch. They are not quite — a part of them (the parameters'
// gradients) does not shrink with it — so a batch Fits accepts may still be refused, but a batch it
// refuses would be: it is safe to skip without trying.
func (e *MemoryError) Fits(batch int) bool {
	if batch < 1 || e.Batch < 1 {
		return false
	}
	for _, r := range e.ranks {
		if r.available >= 0 && r.state+r.activations*float64(batch)/float64(e.Batch) > r.available {
			return false
		}
	}
	return true
}

// checkMemory estimates the memory the model holds once its variables are initialised — every variable
// the probe created (parameters and gradient accumulators), plus up to optimizerStateCopies copies of the
// parameters for each optimizer — and refuses a model that does not fit in the memory this machine has
// available, counting the limits of its cgroups and the runtime's MemoryLimit, and sharing it with the job's
// other processes on this machine. Initialising it anyway ends the process with Go's "fatal error: out of
// memory", which no error handling can catch. Where the available memory is unknown, it checks nothing.
//
// The processes exchange their estimates, so that all refuse together: one refusing alone would leave the
// others waiting in Materialize's next collective (a process on another machine, or with another limit,
// may have less memory).
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
	sharing := processesSharingMemory(m.rt.Comm)
	available, ok := availableMemory("/", sharing)
	if limit := m.rt.MemoryLimit; limit > 0 && (!ok || uint64(limit) < available) {
		available, ok = uint64(limit), true
	}
	mine := memoryNeed{state: state, activations: m.activationBytes, available: -1}
	if ok {
		mine.available = float64(available)
	}
	ranks, err := exchangeMemoryNeeds(m.rt.Comm, mine)
	if err != nil {
		return fmt.Errorf("prepare: comparing the processes' memory: %w", err)
	}
	batch := 0
	if len(m.firstInputs) > 0 && m.firstInputs[0].Rank() > 0 {
		batch = m.firstInputs[0].Dimensions[0]
	}
	for rank, r := range ranks {
		need := r.state + r.activations
		if r.available < 0 || need <= r.available {
			continue
		}
		who, where := "", "on this machine"
		switch {
		case rank != m.rt.Comm.Rank():
			where = "on that process's machine"
		case sharing > 1:
			where = fmt.Sprintf("to each of the %d processes on this machine", sharing)
		}
		if len(ranks) > 1 {
			who = fmt.Sprintf(" on process %d", rank)
		}
		return &MemoryError{Rank: rank, Batch: batch, Need: need, State: r.state, Activations: r.activations,
			Available: r.available, who: who, where: where, params: params, ranks: ranks}
	}
	return nil
}

// exchangeMemoryNeeds gathers every process's estimate, ordered by rank.
func exchangeMemoryNeeds(comm *backends.Communicator, mine memoryNeed) ([]memoryNeed, error) {
	if comm.Size() == 1 {
		return []memoryNeed{mine}, nil
	}
	all := make([]float64, 3*comm.Size())
	if err := comm.AllGather(backends.BufferOf([]float64{mine.state, mine.activations, mine.available}),
		backends.BufferOf(all)); err != nil {
		return nil, err
	}
	ranks := make([]memoryNeed, comm.Size())
	for r := range ranks {
		ranks[r] = memoryNeed{state: all[3*r], activations: all[3*r+1], available: all[3*r+2]}
	}
	return ranks, nil
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
