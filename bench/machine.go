package bench

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/goaccel/goaccel/backends/mpi"
)

// Machine describes where the numbers were taken.
type Machine struct {
	CPU       string  `json:"cpu"`
	Cores     int     `json:"cores"`
	MemoryGiB float64 `json:"memory_gib"`
	OS        string  `json:"os"`
	Kernel    string  `json:"kernel"`
	Go        string  `json:"go"`
	GoMLX     string  `json:"gomlx"`
	MPI       string  `json:"mpi"`
	// Goaccel is the source measured: the git commit, and whether tracked files differed from it.
	Goaccel    string `json:"goaccel"`
	LoadBefore string `json:"load_before"`
	LoadAfter  string `json:"load_after,omitempty"`
}

// DescribeMachine reads the machine's description from /proc and the build.
func DescribeMachine() Machine {
	m := Machine{
		CPU:        firstField("/proc/cpuinfo", "model name", ":"),
		Cores:      runtime.NumCPU(),
		OS:         strings.Trim(firstField("/etc/os-release", "PRETTY_NAME", "="), `"`),
		Kernel:     readTrimmed("/proc/sys/kernel/osrelease"),
		Go:         runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		MPI:        mpi.LibraryVersion(),
		LoadBefore: LoadAverage(),
		Goaccel:    sourceRevision(),
	}
	if kb, err := strconv.ParseFloat(strings.Fields(firstField("/proc/meminfo", "MemTotal", ":") + " 0")[0], 64); err == nil {
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
	s := strings.TrimSpace(string(rev))
	if changes, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil &&
		len(strings.TrimSpace(string(changes))) > 0 {
		s += " with uncommitted changes"
	}
	return s
}

// LoadAverage is /proc/loadavg's 1, 5 and 15 minute load averages: on a shared machine, what else ran.
func LoadAverage() string {
	f := strings.Fields(readTrimmed("/proc/loadavg"))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func readTrimmed(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// firstField returns the value of the first "key<sep>value" line of a file.
func firstField(path, key, sep string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), sep)
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
