package launch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// CheckLinePrefix starts the line in which rank 0 of a check reports, among whatever else the processes
// print (package rankcheck writes it).
const CheckLinePrefix = "goaccel-check: "

// CheckSize is one all-reduce size a check measures, and how many timed runs it takes (after one untimed
// run that opens the connections).
type CheckSize struct {
	Bytes, Runs int
}

// CheckSizes are the all-reduces a check times: 1 MiB, about a first gradient bucket, and 16 MiB, where
// a network's bandwidth rather than its latency decides.
var CheckSizes = []CheckSize{{Bytes: 1 << 20, Runs: 5}, {Bytes: 16 << 20, Runs: 3}}

// CheckInfo is what a process of a check says about its build besides its host's name: the goaccel
// version it was built from and the MPI library it runs (accel's processes give version.String() and the
// first line of MPI_Get_library_version).
type CheckInfo struct {
	GoaccelVersion string `json:"goaccel_version"`
	MPILibrary     string `json:"mpi_library"`
}

// RankCheck is one process of a check.
type RankCheck struct {
	Rank int    `json:"rank"`
	Host string `json:"host"`
	CheckInfo
}

// AllReduceCheck is one all-reduce size as a check measured it.
type AllReduceCheck struct {
	Bytes int `json:"bytes"`
	// Seconds is the median over the timed runs of the slowest process's time.
	Seconds float64 `json:"seconds"`
	Runs    int     `json:"runs"`
	// AlgorithmBandwidth is Bytes/Seconds; BusBandwidth is that times 2(N−1)/N for N processes: the bytes
	// each process sends (and receives) per second in a ring all-reduce, which no link of the ring can carry
	// faster than its rate. Both in bytes per second.
	AlgorithmBandwidth float64 `json:"algorithm_bandwidth"`
	BusBandwidth       float64 `json:"bus_bandwidth"`
}

// CheckReport is what a check found: every process with its host and build, and the all-reduces' times.
type CheckReport struct {
	Ranks      []RankCheck      `json:"ranks"`
	AllReduces []AllReduceCheck `json:"all_reduces"`
}

// CheckHost is one host of a check and the processes on it that run one build.
type CheckHost struct {
	Name  string
	Ranks []int
	CheckInfo
}

// Hosts lists the report's hosts in rank order, with their processes; a host whose processes run different
// builds appears once per build.
func (r *CheckReport) Hosts() []CheckHost {
	var hosts []CheckHost
	for _, rc := range r.Ranks {
		i := slices.IndexFunc(hosts, func(h CheckHost) bool { return h.Name == rc.Host && h.CheckInfo == rc.CheckInfo })
		if i < 0 {
			hosts = append(hosts, CheckHost{Name: rc.Host, CheckInfo: rc.CheckInfo})
			i = len(hosts) - 1
		}
		hosts[i].Ranks = append(hosts[i].Ranks, rc.Rank)
	}
	return hosts
}

// String is the report for people: a line per host, a line per all-reduce size.
func (r *CheckReport) String() string {
	var b strings.Builder
	hosts := r.Hosts()
	names := map[string]bool{}
	width := 0
	for _, h := range hosts {
		names[h.Name] = true
		width = max(width, len(h.Name))
	}
	fmt.Fprintf(&b, "%d process(es) on %d host(s):\n", len(r.Ranks), len(names))
	for _, h := range hosts {
		fmt.Fprintf(&b, "  %-*s  %-10s  goaccel %s; %s\n", width, h.Name, rankList(h.Ranks), h.GoaccelVersion, h.MPILibrary)
	}
	if len(r.AllReduces) == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, "float32 all-reduce across the %d processes (median of the slowest process's times):\n", len(r.Ranks))
	for _, a := range r.AllReduces {
		fmt.Fprintf(&b, "  %6s  %9.3f ms  bus bandwidth %8.3f Gbit/s  (algorithm bandwidth %.3f Gbit/s)\n",
			ByteSize(a.Bytes), a.Seconds*1e3, a.BusBandwidth*8/1e9, a.AlgorithmBandwidth*8/1e9)
	}
	b.WriteString("  bus bandwidth = size / time × 2(N−1)/N: what each process sent and received per second in a ring;\n" +
		"  the slowest link between hosts bounds it\n")
	return b.String()
}

func ByteSize(n int) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d B", n)
}

// MismatchError says that the processes of a check do not all run the same build: Field is "goaccel
// version" or "MPI library", Hosts the groups of processes with each value.
type MismatchError struct {
	Field string
	Hosts []CheckHost
}

func (e *MismatchError) Error() string {
	var parts []string
	for _, h := range e.Hosts {
		v := h.GoaccelVersion
		if e.Field == "MPI library" {
			v = h.MPILibrary
		}
		parts = append(parts, fmt.Sprintf("%q on %s (%s)", v, h.Name, rankList(h.Ranks)))
	}
	return fmt.Sprintf("launch: the processes do not run the same %s: %s; install one build on every host",
		e.Field, strings.Join(parts, ", "))
}

// Mismatches compares the processes' builds.
func Mismatches(ranks []RankCheck) error {
	var errs []error
	for _, field := range []string{"goaccel version", "MPI library"} {
		value := func(rc RankCheck) string {
			if field == "MPI library" {
				return rc.MPILibrary
			}
			return rc.GoaccelVersion
		}
		if slices.ContainsFunc(ranks, func(rc RankCheck) bool { return value(rc) != value(ranks[0]) }) {
			errs = append(errs, &MismatchError{Field: field, Hosts: (&CheckReport{Ranks: ranks}).Hosts()})
		}
	}
	return errors.Join(errs...)
}

// Check runs a short job across the hosts before a real one, as `accel launch --check` does: procs
// copies of program with args (a program whose processes call CheckRank: accel's hidden check-rank
// command), with the same options as the job (hosts, network, launch agent, environment). It returns the
// report, and an error when a host cannot be reached (a *HostError, before anything starts, see
// WithHostProbe), a process fails, the processes run different goaccel versions or MPI libraries (a
// *MismatchError, with the report), or ctx ends first: give it a deadline, a check must not hang.
func Check(ctx context.Context, procs int, program string, args []string, opts ...Option) (*CheckReport, error) {
	c := newConfig(opts)
	c.maxRestarts, c.tagOutput = 0, false
	var stdout, stderr bytes.Buffer
	c.stdout, c.stderr = &stdout, &stderr
	code, failure, err := c.runOnce(ctx, procs, program, args, nil)
	output := func() string { return tailLines(stderr.String()+stdout.String(), 15) }
	switch {
	case err != nil:
		return nil, err
	case ctx.Err() != nil:
		return nil, fmt.Errorf("launch: the check did not finish (%v); its output:\n%s", context.Cause(ctx), output())
	case failure != nil:
		return nil, fmt.Errorf("launch: the check failed: %s; its output:\n%s", failure, output())
	case code != 0:
		return nil, fmt.Errorf("launch: the check failed (mpirun's exit code %d); its output:\n%s", code, output())
	}
	var report *CheckReport
	scanner := bufio.NewScanner(&stdout)
	scanner.Buffer(nil, 1<<20)
	for scanner.Scan() {
		if line, ok := strings.CutPrefix(scanner.Text(), CheckLinePrefix); ok {
			report = &CheckReport{}
			if err := json.Unmarshal([]byte(line), report); err != nil {
				return nil, fmt.Errorf("launch: the check's report %q: %w", line, err)
			}
		}
	}
	if report == nil {
		return nil, fmt.Errorf("launch: the check ended without a report (is %s a program that calls CheckRank, "+
			"built with -tags mpi?); its output:\n%s", program, output())
	}
	if procs > 0 && len(report.Ranks) != procs {
		return report, fmt.Errorf("launch: the check reports %d processes, %d were started", len(report.Ranks), procs)
	}
	if err := Mismatches(report.Ranks); err != nil {
		return report, err
	}
	for _, a := range report.AllReduces {
		if !(a.BusBandwidth > 0) || math.IsInf(a.BusBandwidth, 0) {
			return report, fmt.Errorf("launch: the check measured no bandwidth for %s all-reduces (%g s)", ByteSize(a.Bytes), a.Seconds)
		}
	}
	if len(report.Ranks) > 1 && len(report.AllReduces) != len(CheckSizes) {
		return report, fmt.Errorf("launch: the check measured %d all-reduce sizes, want %d", len(report.AllReduces), len(CheckSizes))
	}
	return report, nil
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"…"}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
