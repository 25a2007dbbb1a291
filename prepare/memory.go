package prepare

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
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
	need := vars + float64(len(m.onMaterialize)*optimizerStateCopies)*params
	available, ok := availableMemory()
	if !ok || need <= float64(available) {
		return nil
	}
	return fmt.Errorf("prepare: the model needs about %s for its parameters (%s), gradient accumulators and "+
		"optimizer state, more than the %s of memory available on this machine: make the model smaller",
		byteSize(need), byteSize(params), byteSize(float64(available)))
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
