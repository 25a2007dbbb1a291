package bench

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/goaccel/goaccel/backends/mpi"
)

// machine describes where the numbers were taken.
type machine struct {
	CPU                        string
	Cores                      int
	MemoryGiB                  float64
	OS, Kernel, Go, GoMLX, MPI string
	PyTorch                    string // the end-to-end section's reference ("": not run)
	// OpenBLASCore is OPENBLAS_CORETYPE as every measured process inherits it: OpenBLAS (goaccel's with
	// -tags blas, and PyTorch's) runs that core's kernels instead of the processor's own ("": unset).
	OpenBLASCore          string
	Goaccel               string // the commit measured, noting uncommitted changes
	LoadBefore, LoadAfter string
}

// describeMachine reads the machine's description from /proc, the build and git.
func describeMachine() machine {
	m := machine{
		CPU:          cpuName(),
		Cores:        runtime.NumCPU(),
		OS:           strings.Trim(firstField("/etc/os-release", "PRETTY_NAME", "="), `"`),
		Kernel:       firstField("/proc/sys/kernel/osrelease", "", ""),
		Go:           runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		MPI:          mpi.LibraryVersion(),
		LoadBefore:   loadAverage(),
		Goaccel:      sourceRevision(),
		OpenBLASCore: os.Getenv("OPENBLAS_CORETYPE"),
	}
	if kb, err := strconv.ParseFloat(strings.TrimSuffix(firstField("/proc/meminfo", "MemTotal", ":"), " kB"), 64); err == nil {
		m.MemoryGiB = kb / (1 << 20)
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "github.com/gomlx/gomlx" {
				m.GoMLX = dep.Version
			}
		}
	}
	if m.MPI == "" {
		m.MPI = "none (built without -tags mpi)"
	}
	return m
}

// sourceRevision names the commit of the working tree the benchmark runs in (`make bench` runs it from
// the repository root), noting uncommitted changes to tracked files; "" without git.
func sourceRevision() string {
	rev, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	changes, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
	if len(strings.TrimSpace(string(changes))) > 0 {
		return strings.TrimSpace(string(rev)) + " with uncommitted changes"
	}
	return strings.TrimSpace(string(rev))
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute load averages: on a shared machine, what else ran.
func loadAverage() string {
	f := strings.Fields(firstField("/proc/loadavg", "", ""))
	return strings.Join(f[:min(len(f), 3)], " ")
}

// cpuName is the processor's model name with its family and model numbers, which tell generations apart
// where the name does not ("AMD EPYC" is Zen 4 in family 25, Zen 5 in family 26): the width of the vector
// units, and so how fast both frameworks' products run, depends on them.
func cpuName() string {
	name := firstField("/proc/cpuinfo", "model name", ":")
	family, model := firstField("/proc/cpuinfo", "cpu family", ":"), firstField("/proc/cpuinfo", "model", ":")
	if family == "" || model == "" {
		return name
	}
	return fmt.Sprintf("%s (family %s, model %s)", name, family, model)
}

// firstField returns the value of the first "key<sep>value" line of a file; with an empty key, the
// whole first line.
func firstField(path, key, sep string) string {
	data, _ := os.ReadFile(path) // a missing file leaves the field empty
	for line := range strings.Lines(string(data)) {
		if key == "" {
			return strings.TrimSpace(line)
		}
		if k, v, ok := strings.Cut(line, sep); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
