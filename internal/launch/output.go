package launch

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/goaccel/goaccel/internal/jobenv"
)

// Output sorts the output of a job whose mpirun tags every line with its rank (Open MPI's --tag-output,
// which WithTaggedOutput adds): each rank's lines go whole to DIR/rank-N.log and mpirun's own to
// DIR/mpirun.log, while the terminal gets the ranks' standard output as they wrote it, each distinct error
// line once (with the rank that wrote it first), and mpirun's messages without the banners that only
// restate a failure the ranks already explained (MPI_ABORT, "exited improperly", help aggregation). After
// the job, Summary lists each distinct error line with every rank that wrote it. With
// WithRankAnnouncements, the processes' announcements go to DIR/ranks.txt and OnRanks instead of the
// terminal.
type Output struct {
	dir            string
	stdout, stderr io.Writer

	mu       sync.Mutex
	files    map[int]*os.File // per rank
	mpirun   *os.File
	errLines []errLine // distinct error lines, in order of appearance
	block    []string  // mpirun lines of a banner being read (between dashed lines)
	inBlock  bool
	// ranks are the processes of the job's current run that announced themselves (WithRankAnnouncements);
	// onRanks is told once all did.
	ranks   rankProcesses
	onRanks func([]RankProcess, string)
	// states are the ranks' latest hang report states (hang.go); onStall is told when one reports a
	// collective timeout.
	states  map[int]stateArrival
	onStall func(time.Time)
}

type errLine struct {
	key   string // the text as sameFromEveryRank writes it, for comparing
	text  string // the first rank's words
	ranks []int
}

// NewOutput writes the job's logs under dir (created if needed) and the terminal's share to stdout and
// stderr.
func NewOutput(dir string, stdout, stderr io.Writer) (*Output, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("launch: output directory: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, "mpirun.log"))
	if err != nil {
		return nil, fmt.Errorf("launch: output directory: %w", err)
	}
	return &Output{dir: dir, stdout: stdout, stderr: stderr, files: map[int]*os.File{}, mpirun: f}, nil
}

// logPattern is where rank N's whole output is.
func (o *Output) logPattern() string { return filepath.Join(o.dir, "rank-N.log") }

// Dir is where the logs are.
func (o *Output) Dir() string { return o.dir }

// Stdout and Stderr are the writers for mpirun's two streams.
func (o *Output) Stdout() io.Writer { return &lineWriter{emit: o.line} }

// Stderr: see Stdout.
func (o *Output) Stderr() io.Writer { return &lineWriter{emit: o.line} }

// tagged matches Open MPI's --tag-output prefix: [jobid,rank]<stream>:
var tagged = regexp.MustCompile(`^\[\d+,(\d+)\]<(stdout|stderr|stddiag)>:(.*)$`)

// noise are mpirun's messages that restate a failure the ranks report themselves.
var noise = []string{
	"MPI_ABORT was invoked", "mpirun has exited due to process rank", "exiting improperly",
	"Primary job  terminated normally", "mpirun detected that one or more processes exited with non-zero status",
	"mpirun noticed that process rank", "ORTE_ERROR_LOG", "help message help-", "orte_base_help_aggregate",
	"NOTE: invoking MPI_ABORT",
	// The launcher asked the ranks for their hang reports (ReportSignal) and says so itself.
	"mpirun: Forwarding signal",
}

func isNoise(line string) bool {
	return slices.ContainsFunc(noise, func(n string) bool { return strings.Contains(line, n) })
}

func (o *Output) line(line string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := tagged.FindStringSubmatch(line)
	if m == nil {
		o.mpirunLine(line)
		return
	}
	rank, _ := strconv.Atoi(m[1])
	stream, text := m[2], m[3]
	if f := o.rankFile(rank); f != nil {
		fmt.Fprintf(f, "%s: %s\n", stream, text)
	}
	if p, ok := parseRankLine(text); ok && p.Rank == rank {
		o.rankAnnounced(p) // in the rank's log, ranks.txt and OnRanks's table, not on the terminal
		return
	}
	// A hang report is for the rank's log; its state line, for the launcher's summary.
	if strings.HasPrefix(text, jobenv.ReportLinePrefix) {
		return
	}
	if state, ok := strings.CutPrefix(text, jobenv.StateLinePrefix); ok {
		o.stateLine(rank, state)
		return
	}
	if stream == "stdout" {
		fmt.Fprintln(o.stdout, text)
		return
	}
	if isRankNoise(text) {
		return // in the rank's log only
	}
	// "rank 2 of 4: …" from rank 2 and "rank 3 of 4: …" from rank 3 say the same thing.
	key := sameFromEveryRank(text, rank)
	for i := range o.errLines {
		if o.errLines[i].key == key {
			o.errLines[i].ranks = append(o.errLines[i].ranks, rank)
			return // the same words from another rank: once on the terminal is enough
		}
	}
	o.errLines = append(o.errLines, errLine{key: key, text: text, ranks: []int{rank}})
	fmt.Fprintf(o.stderr, "rank %d: %s\n", rank, text)
}

// rankNoise are lines a rank's MPI library writes to its standard error that only restate an error the
// rank reports itself: Open MPI's libnbc (its non-blocking collectives) prints these two, with a pointer
// and an error number, whenever a collective fails, and no setting turns them off. goaccel's own error
// (a *backends.CollectiveError) says which collective it was, what the rank called, and the error.
var rankNoise = []string{"MPI Error in NBC subrequest", "NBC_Progress: an error "}

func isRankNoise(line string) bool {
	return slices.ContainsFunc(rankNoise, func(n string) bool { return strings.HasPrefix(line, n) })
}

// rankPrefix matches a line's rank prefix: the tag with which a program says which rank wrote it, after
// the labels that may come first ("grad_accum: rank 2 of 4: …", "rank 2: …", "accel check-rank: rank 2: …").
var rankPrefix = regexp.MustCompile(`^((?:[^\s:]+(?: [^\s:]+)?: )*)rank (\d+)( of \d+:|:)`)

// backendList matches GoMLX's list of its backends in an error ("backends available: "go", "xla""), whose
// order varies from process to process (it comes from a map).
var backendList = regexp.MustCompile(`(backends available: )("[^"]*"(?:, "[^"]*")*)`)

// sameFromEveryRank writes text so that the same message from every rank reads the same: the writer's own
// rank number in the rank prefix becomes N, and GoMLX's list of backends is sorted. Rank numbers elsewhere
// in the line ("rank 1 failed", "collective #3 … on rank 1", "backends: rank 1: collective #1" after the
// prefix) are facts of the message and stay.
func sameFromEveryRank(text string, rank int) string {
	if m := rankPrefix.FindStringSubmatchIndex(text); m != nil && text[m[4]:m[5]] == strconv.Itoa(rank) {
		text = text[:m[4]] + "N" + text[m[5]:]
	}
	return backendList.ReplaceAllStringFunc(text, func(list string) string {
		m := backendList.FindStringSubmatch(list)
		names := strings.Split(m[2], ", ")
		slices.Sort(names)
		return m[1] + strings.Join(names, ", ")
	})
}

// mpirunLine passes mpirun's own messages on, except banners (blocks between dashed lines) and single
// lines that only restate the ranks' failure.
func (o *Output) mpirunLine(line string) {
	fmt.Fprintln(o.mpirun, line)
	dashes := strings.HasPrefix(line, "-----") && strings.Trim(line, "-") == ""
	switch {
	case dashes && !o.inBlock:
		o.inBlock, o.block = true, o.block[:0]
	case dashes:
		o.inBlock = false
		if !slices.ContainsFunc(o.block, isNoise) {
			fmt.Fprintln(o.stderr, strings.Repeat("-", 74))
			for _, l := range o.block {
				fmt.Fprintln(o.stderr, l)
			}
			fmt.Fprintln(o.stderr, strings.Repeat("-", 74))
		}
	case o.inBlock:
		o.block = append(o.block, line)
	case !isNoise(line):
		fmt.Fprintln(o.stderr, line)
	}
}

func (o *Output) rankFile(rank int) *os.File {
	if f, ok := o.files[rank]; ok {
		return f
	}
	f, err := os.Create(filepath.Join(o.dir, fmt.Sprintf("rank-%d.log", rank)))
	if err != nil {
		f = nil // the terminal still gets the line
	}
	o.files[rank] = f
	return f
}

// Summary describes a failed job: each distinct error line with the ranks that wrote it, and where every
// rank's whole output is. Empty when no rank wrote an error line.
func (o *Output) Summary() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.errLines) == 0 {
		return ""
	}
	var b strings.Builder
	for _, l := range o.errLines {
		// One rank's line is its own words; several ranks' share the words but for the writer's rank.
		text := l.text
		if len(slices.Compact(slices.Sorted(slices.Values(l.ranks)))) > 1 {
			text = l.key
		}
		fmt.Fprintf(&b, "  %s: %s\n", rankList(l.ranks), text)
	}
	fmt.Fprintf(&b, "  (every rank's whole output: %s)\n", filepath.Join(o.dir, "rank-N.log"))
	return b.String()
}

// Close flushes a banner left open and closes the logs.
func (o *Output) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, l := range o.block {
		if o.inBlock && !isNoise(l) {
			fmt.Fprintln(o.stderr, l)
		}
	}
	var errs []error
	for _, f := range o.files {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	errs = append(errs, o.mpirun.Close())
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// rankList writes ranks as "rank 2" or "ranks 0-3, 5".
func rankList(ranks []int) string {
	rs := slices.Clone(ranks)
	slices.Sort(rs)
	rs = slices.Compact(rs)
	var parts []string
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", rs[i], rs[j]))
		} else {
			parts = append(parts, strconv.Itoa(rs[i]))
		}
		i = j + 1
	}
	if len(rs) == 1 {
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts, ", ")
}

// lineWriter splits a stream into lines, each passed to emit without its line ending. It puts back
// together the lines of mpirun's --tag-output that a process wrote in pieces (see joinTagged).
type lineWriter struct {
	emit func(line string)
	buf  bytes.Buffer
	// pieces are, per tag, the text a process wrote so far of a line it has not ended.
	pieces map[string]string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	for {
		i := bytes.IndexByte(w.buf.Bytes(), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.buf.Next(i + 1))
		for _, l := range w.joinTagged(strings.TrimRight(line, "\r\n")) {
			w.emit(l)
		}
	}
}

// tagAnywhere finds Open MPI's --tag-output tags in a line.
var tagAnywhere = regexp.MustCompile(`\[\d+,\d+\]<(?:stdout|stderr|stddiag)>:`)

// joinTagged returns the lines the processes wrote, whole. Open MPI's mpirun tags what it reads of a
// process's output piece by piece, and a process that writes a line in several pieces (Go's runtime writes
// a crash report a few bytes at a time; the C stack of Open MPI's signal handler comes in three) reaches
// mpirun's output as "[1,1]<stderr>:panic: [1,1]<stderr>:runtime error: …", or in several lines when the
// pieces of other processes come between. Each tag's text is kept until a line ends after it, and that
// line is the tag and all its text; text before the first tag is a line of its own. A line with one tag,
// at its start, and no piece kept, is left as it is.
func (w *lineWriter) joinTagged(line string) []string {
	locs := tagAnywhere.FindAllStringIndex(line, -1)
	if len(locs) == 0 || len(locs) == 1 && locs[0][0] == 0 && len(w.pieces) == 0 {
		return []string{line}
	}
	if w.pieces == nil {
		w.pieces = map[string]string{}
	}
	var out []string
	if lead := line[:locs[0][0]]; lead != "" {
		out = append(out, lead)
	}
	for i, loc := range locs {
		tag := line[loc[0]:loc[1]]
		if i+1 < len(locs) {
			w.pieces[tag] += line[loc[1]:locs[i+1][0]]
			continue
		}
		out = append(out, tag+w.pieces[tag]+line[loc[1]:])
		delete(w.pieces, tag)
	}
	return out
}

// WithTaggedOutput makes Open MPI's mpirun tag every line with its rank (--tag-output), for Output.
func WithTaggedOutput() Option {
	return func(c *config) { c.tagOutput = true }
}
