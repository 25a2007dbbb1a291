package prepare

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // the graph's node types read best unqualified
)

// optimizerStateCopies is how many copies of the parameters an optimizer may keep: Adam keeps two moments.
const optimizerStateCopies = 2

// checkMemory estimates the memory the model holds once its variables are initialised — every variable
// the probe created (parameters and gradient accumulators), plus up to optimizerStateCopies copies of the
// parameters for each optimizer — and refuses a model that does not fit in the memory this machine has
// available. Initialising it anyway ends the process with Go's "fatal error: out of memory", which no
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
	available, ok := availableMemory()
	if !ok || need <= float64(available) {
		return nil
	}
	batch := 0
	if len(m.firstInputs) > 0 && m.firstInputs[0].Rank() > 0 {
		batch = m.firstInputs[0].Dimensions[0]
	}
	return fmt.Errorf("prepare: the model needs about %s — %s for its parameters (%s), gradient accumulators and "+
		"optimizer state, and %s for the activations and gradients of one micro-batch of %d examples — more than "+
		"the %s of memory available on this machine: use a smaller batch per process (or more processes, or "+
		"gradient accumulation), or a smaller model", byteSize(need), byteSize(state), byteSize(params),
		byteSize(m.activationBytes), batch, byteSize(float64(available)))
}

// peakLiveBytes estimates the memory a training step's intermediate values need at their peak, as the
// pure-Go backend runs a graph: one node after the other in the order they were built, each output alive
// from its node until its last consumer ran, parameters and variables not counted (they are the batch and
// the model's state). An element-wise node may write into an input it is the last user of; counting it
// anyway makes this an upper bound of that backend's need, and close to it: a job refused here would have
// ended in Go's "fatal error: out of memory", which no error handling can catch.
func peakLiveBytes(g *Graph, outputs []*Node) float64 {
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

// availableMemory is the memory this process can still allocate: the kernel's MemAvailable, or less if a
// cgroup limit leaves less.
func availableMemory() (uint64, bool) {
	available, ok := memAvailable("/proc/meminfo")
	if limit, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if max, err := strconv.ParseUint(strings.TrimSpace(string(limit)), 10, 64); err == nil {
			used := uint64(0)
			if current, err := os.ReadFile("/sys/fs/cgroup/memory.current"); err == nil {
				used, _ = strconv.ParseUint(strings.TrimSpace(string(current)), 10, 64)
			}
			left := uint64(0)
			if max > used {
				left = max - used
			}
			if !ok || left < available {
				available, ok = left, true
			}
		}
	}
	return available, ok
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
