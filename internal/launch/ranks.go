package launch

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// RankLinePrefix starts the line with which each process of a job says who it is, at its start (see
// WithRankAnnouncements): "goaccel-rank: rank=1 size=4 host=node1 pid=8682".
const RankLinePrefix = "goaccel-rank: "

// announceScript is what runs in place of the program under WithRankAnnouncements: it writes the process's
// line to standard error and replaces itself with the program (exec keeps the process ID, so the PID is
// the program's own). Open MPI gives every process its rank and the job's size in its environment, on
// every host; uname -n is the host's name as the process sees it (what os.Hostname says).
const announceScript = `printf '` + RankLinePrefix + `rank=%s size=%s host=%s pid=%s\n' "${OMPI_COMM_WORLD_RANK-}" ` +
	`"${OMPI_COMM_WORLD_SIZE-}" "$(uname -n)" "$$" >&2; exec "$@"`

// announcer are the words that run the program through announceScript: /bin/sh -c SCRIPT NAME PROGRAM ARGS...
// (NAME is the shell's $0, which names it in its own errors).
var announcer = []string{"/bin/sh", "-c", announceScript, "goaccel-rank"}

// WithRankAnnouncements has every process of an Open MPI job say, as it starts, its rank, its host and
// its process ID, so that one can be signalled or profiled: the program runs through a small /bin/sh that
// writes the process's line (RankLinePrefix) to its standard error and then replaces itself with the
// program, keeping its process ID. Output reads these lines (see Output.OnRanks). A program whose name
// starts with '-' is started directly, unannounced. Argv shows the wrapper; nothing else about the job
// changes: the program gets the same arguments, environment, standard streams and signals.
func WithRankAnnouncements() Option { return func(c *config) { c.announce = true } }

// RankProcess is one process of a job as it announced itself (WithRankAnnouncements).
type RankProcess struct {
	Rank, Size int
	Host       string
	PID        int
}

// rankLine matches an announcement after its prefix.
var rankLine = regexp.MustCompile(`^rank=(\d+) size=(\d+) host=(\S*) pid=(\d+)$`)

// parseRankLine reads a process's announcement (the text of a line, after any tag).
func parseRankLine(text string) (RankProcess, bool) {
	rest, ok := strings.CutPrefix(text, RankLinePrefix)
	if !ok {
		return RankProcess{}, false
	}
	m := rankLine.FindStringSubmatch(strings.TrimSpace(rest))
	if m == nil {
		return RankProcess{}, false
	}
	p := RankProcess{Host: m[3]}
	var errs [3]error
	p.Rank, errs[0] = strconv.Atoi(m[1])
	p.Size, errs[1] = strconv.Atoi(m[2])
	p.PID, errs[2] = strconv.Atoi(m[4])
	if errs[0] != nil || errs[1] != nil || errs[2] != nil || p.Rank >= p.Size {
		return RankProcess{}, false
	}
	return p, true
}

// RanksFile is the file of an Output's directory that lists the job's processes, one a line: rank, host
// and process ID, after a comment line ("# rank host pid"). It is rewritten as the processes announce
// themselves, and for each run of a restarted job.
const RanksFile = "ranks.txt"

// rankProcesses are the processes of one run of a job, as they announced themselves.
type rankProcesses struct {
	procs map[int]RankProcess
	size  int
	told  bool // OnRanks was called for this run
}

// OnRanks calls fn once every process of a run of the job announced itself (WithRankAnnouncements), with
// them in rank order and the path of RanksFile; again for each run of a restarted job (see Restarted).
func (o *Output) OnRanks(fn func(procs []RankProcess, file string)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.onRanks = fn
}

// Restarted says that the job starts again: the processes that announce themselves next are a new run's.
func (o *Output) Restarted() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ranks = rankProcesses{}
	o.states = nil
}

// rankAnnounced records a process's announcement; o.mu is held.
func (o *Output) rankAnnounced(p RankProcess) {
	if o.ranks.procs == nil {
		o.ranks.procs = map[int]RankProcess{}
	}
	o.ranks.procs[p.Rank] = p
	o.ranks.size = max(o.ranks.size, p.Size)
	procs := slices.SortedFunc(func(yield func(RankProcess) bool) {
		for _, p := range o.ranks.procs {
			if !yield(p) {
				return
			}
		}
	}, func(a, b RankProcess) int { return a.Rank - b.Rank })
	file := filepath.Join(o.dir, RanksFile)
	_ = writeRanksFile(file, procs)
	if len(procs) == o.ranks.size && !o.ranks.told {
		o.ranks.told = true
		if o.onRanks != nil {
			o.onRanks(procs, file)
		}
	}
}

// writeRanksFile writes procs to path whole (through a temporary file, so that a reader never sees half
// of it).
func writeRanksFile(path string, procs []RankProcess) error {
	var b strings.Builder
	b.WriteString("# rank host pid\n")
	for _, p := range procs {
		fmt.Fprintf(&b, "%d %s %d\n", p.Rank, p.Host, p.PID)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// RankTable writes procs for people, a line per process: "  rank 0  node1  PID 8682".
func RankTable(procs []RankProcess) string {
	hostWidth, rankWidth := 0, 0
	for _, p := range procs {
		hostWidth = max(hostWidth, len(p.Host))
		rankWidth = max(rankWidth, len(strconv.Itoa(p.Rank)))
	}
	var b strings.Builder
	for _, p := range procs {
		fmt.Fprintf(&b, "  rank %-*d  %-*s  PID %d\n", rankWidth, p.Rank, hostWidth, p.Host, p.PID)
	}
	return b.String()
}
