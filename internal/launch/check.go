package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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
// *MismatchError, with the report), or ctx ends first: give it a deadline, a check must not hang. The error
// of a check that failed quotes what the processes said that matters, each line after its rank: the
// first lines of a crash report (the panic or signal, and the failing call: see crashExcerpt), else their
// last error lines; WithCheckLogs keeps all of it.
func Check(ctx context.Context, procs int, program string, args []string, opts ...Option) (*CheckReport, error) {
	c := newConfig(opts)
	// Every line tagged with its rank (Open MPI): what each process said can be told apart.
	c.maxRestarts, c.tagOutput, c.announce = 0, true, false
	lines := &checkLines{}
	if c.checkLogs != "" {
		logs, err := NewOutput(c.checkLogs, io.Discard, io.Discard)
		if err != nil {
			return nil, err
		}
		defer logs.Close()
		lines.logs = logs
	}
	c.stdout, c.stderr = &lineWriter{emit: lines.line}, &lineWriter{emit: lines.line}
	// The check's processes are not the job's: they make no hang reports, and the check has a deadline of
	// its own.
	c.hangOut = nil
	code, failure, err := c.runOnce(ctx, procs, program, args, nil, nil, nil)
	failed := -1
	if failure != nil {
		failed = failure.Rank
	}
	output := func() string { return lines.explain(failed, c.checkLogs) }
	switch {
	case err != nil:
		return nil, err
	case ctx.Err() != nil:
		return nil, fmt.Errorf("launch: the check did not finish (%v); %s", context.Cause(ctx), output())
	case failure != nil:
		return nil, fmt.Errorf("launch: the check failed: %s; %s", failure, output())
	case code != 0:
		return nil, fmt.Errorf("launch: the check failed (mpirun's exit code %d); %s", code, output())
	}
	var report *CheckReport
	for _, line := range lines.reports() {
		report = &CheckReport{}
		if err := json.Unmarshal([]byte(line), report); err != nil {
			return nil, fmt.Errorf("launch: the check's report %q: %w", line, err)
		}
	}
	if report == nil {
		return nil, fmt.Errorf("launch: the check ended without a report (is %s a program that calls CheckRank, "+
			"built with -tags mpi?); %s", program, output())
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

// WithCheckLogs makes Check keep everything its job wrote, as Output does for a job's: each process's lines
// in DIR/rank-N.log, mpirun's in DIR/mpirun.log (DIR is created if needed).
func WithCheckLogs(dir string) Option { return func(c *config) { c.checkLogs = dir } }

// checkLines keeps what a check's job wrote, by process: each process's lines (those of Open MPI's
// --tag-output, without their tag), and mpirun's own or, untagged (another MPI), everything, as rank -1.
type checkLines struct {
	mu    sync.Mutex
	ranks map[int]*keptLines
	logs  *Output
}

// keptLines are the last lines of one process, at most maxKeptBytes of them.
type keptLines struct {
	lines, stderr []string // stderr: its standard error's lines (all of them for mpirun's)
	bytes         int
}

// maxKeptBytes bounds what a check keeps of one process's output in memory (WithCheckLogs keeps it all).
const maxKeptBytes = 4 << 20

func (l *checkLines) line(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.logs != nil {
		l.logs.line(line)
	}
	rank, stream, text := -1, "stderr", line
	if m := tagged.FindStringSubmatch(line); m != nil {
		rank, _ = strconv.Atoi(m[1])
		stream, text = m[2], m[3]
	}
	if l.ranks == nil {
		l.ranks = map[int]*keptLines{}
	}
	k := l.ranks[rank]
	if k == nil {
		k = &keptLines{}
		l.ranks[rank] = k
	}
	k.lines = append(k.lines, text)
	if stream != "stdout" {
		k.stderr = append(k.stderr, text)
	}
	for k.bytes += len(text); k.bytes > maxKeptBytes && len(k.lines) > 1; k.lines = k.lines[1:] {
		k.bytes -= len(k.lines[0])
	}
	if len(k.stderr) > 1000 {
		k.stderr = k.stderr[len(k.stderr)-100:]
	}
}

// reports are the check reports the processes wrote (rank 0 writes one), without their prefix.
func (l *checkLines) reports() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, rank := range []int{0, -1} {
		if k := l.ranks[rank]; k != nil {
			for _, line := range k.lines {
				if report, ok := strings.CutPrefix(line, CheckLinePrefix); ok {
					out = append(out, report)
				}
			}
		}
	}
	return out
}

// maxExplainLines bounds the lines explain quotes.
const maxExplainLines = 40

// explain says what the check's processes said that matters, for its error: for each process, the
// failed one (failed, -1 when unknown) first, the excerpt of its crash report or else its last error
// lines, each line once with the ranks that wrote it; then the lines of Open MPI's error handler that
// reached mpirun untagged, or, when no process said anything, mpirun's last lines; then where the logs
// are (dir, "" when none are kept).
func (l *checkLines) explain(failed int, dir string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var order []int
	for rank := range l.ranks {
		if rank >= 0 {
			order = append(order, rank)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case a == failed:
			return -1
		case b == failed:
			return 1
		}
		return a - b
	})
	type said struct {
		key, text string
		ranks     []int
	}
	var all []said
	for _, rank := range order {
		k := l.ranks[rank]
		lines := crashExcerpt(k.lines)
		if lines == nil {
			lines = lastErrorLines(k.stderr, 4)
		}
		for _, text := range lines {
			key := sameFromEveryRank(text, rank)
			if i := slices.IndexFunc(all, func(s said) bool { return s.key == key }); i >= 0 {
				all[i].ranks = append(all[i].ranks, rank)
				continue
			}
			all = append(all, said{key: key, text: text, ranks: []int{rank}})
		}
	}
	// Open MPI's error handler and help messages reach the terminal through mpirun, untagged.
	var untagged []string
	if k := l.ranks[-1]; k != nil {
		untagged = crashExcerpt(k.lines)
		if len(all) == 0 && untagged == nil {
			// mpirun's lines that only restate a failure, or that say that Open MPI could not print its
			// message (ORTE_ERROR_LOG), are left out, unless they are all it said.
			blank := func(l string) bool { return strings.TrimSpace(l) == "" }
			untagged = slices.DeleteFunc(slices.Clone(k.lines), func(l string) bool { return blank(l) || isNoise(l) })
			if len(untagged) == 0 {
				untagged = slices.DeleteFunc(slices.Clone(k.lines), blank)
			}
		}
	}
	var b strings.Builder
	switch {
	case len(all) > 0:
		b.WriteString("what the processes said:")
		for i, s := range all {
			if i == maxExplainLines {
				fmt.Fprintf(&b, "\n  … (%d lines more)", len(all)-i)
				break
			}
			text := s.text
			if len(s.ranks) > 1 {
				text = s.key
			}
			fmt.Fprintf(&b, "\n  %s: %s", rankList(s.ranks), text)
		}
		for _, line := range untagged {
			fmt.Fprintf(&b, "\n  mpirun: %s", line)
		}
	case len(untagged) > 0:
		b.WriteString("its output:")
		for _, line := range strings.Split(tailLines(strings.Join(untagged, "\n"), 15), "\n") {
			b.WriteString("\n  " + line)
		}
	default:
		b.WriteString("it wrote nothing")
	}
	switch {
	case dir != "" && len(order) > 0:
		fmt.Fprintf(&b, "\n  (every process's whole output: %s, mpirun's: %s)", filepath.Join(dir, "rank-N.log"),
			filepath.Join(dir, "mpirun.log"))
	case dir != "":
		fmt.Fprintf(&b, "\n  (mpirun's whole output: %s)", filepath.Join(dir, "mpirun.log"))
	}
	return b.String()
}

// lastErrorLines are the last n lines of a process's standard error that are neither blank nor the lines
// of Open MPI's that only restate an error (isNoise, isRankNoise).
func lastErrorLines(lines []string, n int) []string {
	var out []string
	for _, l := range slices.Backward(lines) {
		if len(out) == n {
			break
		}
		if strings.TrimSpace(l) != "" && !isNoise(l) && !isRankNoise(l) {
			out = append(out, l)
		}
	}
	slices.Reverse(out)
	return out
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"…"}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
