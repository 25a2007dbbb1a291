package launch

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/goaccel/goaccel/internal/jobenv"
)

// ReportSignal is what the launcher sends mpirun to ask every rank of the job for its hang report: Open
// MPI's mpirun forwards SIGUSR1 and SIGUSR2 to the job's processes (ess_base_forward_signals), and a
// goaccel rank answers SIGUSR2 (accel.ReportSignal). SIGUSR1 is the user's way to ask the launcher, and
// the guard shell's parent-death signal (guardScript): the two never meet, as the launcher sends the guard
// only SIGUSR2, which the guard passes on.
const ReportSignal = syscall.SIGUSR2

// AskSignal is the signal with which a user asks `accel launch` (Run with WithHangReports) for a hang
// report of its running job: kill -USR1 <launcher's PID>.
const AskSignal = syscall.SIGUSR1

// hangAnswerWait is how long the launcher waits for the ranks' answers before it writes the summary
// without those that did not answer: a rank answers in milliseconds, unless it is stopped or stuck in
// native code, where it never does. It is shorter than the grace after which a rank that gave up on a
// collective aborts the job (3 s, backends' failureGrace): Open MPI's mpirun continues a stopped process
// (SIGCONT) as it ends the job, and a rank that answers only then was not answering.
var hangAnswerWait = 2 * time.Second

// WithHangReports makes Run answer for a job whose output out sorts (see NewOutput) the question "where
// is it stuck": when the launcher receives AskSignal, when a rank reports that a collective timed out,
// and when WithJobTimeout's time is up, Run asks every rank for its hang report (ReportSignal, through
// mpirun), waits for their answers (a few seconds at most) and writes one summary on out's terminal: which
// ranks wait in which collective and for how long, which have not arrived there and what they are doing,
// and which did not answer (HangSummary). The ranks' whole reports, goroutine stacks included, are in their
// logs.
func WithHangReports(out *Output) Option { return func(c *config) { c.hangOut = out } }

// WithJobTimeout stops the job once it has run for d (all its restarts together): with WithHangReports it
// first asks the ranks what they are doing and writes the summary. Run then returns JobTimeoutExitCode
// and a *JobTimeoutError.
func WithJobTimeout(d time.Duration) Option { return func(c *config) { c.jobTimeout = d } }

// JobTimeoutExitCode is Run's exit code for a job stopped at WithJobTimeout's time, as coreutils'
// timeout(1) exits.
const JobTimeoutExitCode = 124

// JobTimeoutError is Run's error for a job that ran past WithJobTimeout's time and was stopped.
type JobTimeoutError struct {
	After time.Duration
}

func (e *JobTimeoutError) Error() string {
	return fmt.Sprintf("launch: the job ran past its timeout (%s) and was stopped", e.After)
}

// stateArrival is a rank's hang report state and when the launcher read it.
type stateArrival struct {
	state jobenv.RankState
	at    time.Time
}

// stateLine records a rank's state line (jobenv.StateLinePrefix, then JSON); o.mu is held. A state that
// reports a collective timeout tells onStall, which asks the other ranks.
func (o *Output) stateLine(rank int, text string) {
	var s jobenv.RankState
	if err := json.Unmarshal([]byte(text), &s); err != nil || s.Rank != rank {
		return // not a state goaccel wrote: it stays in the rank's log only
	}
	if o.states == nil {
		o.states = map[int]stateArrival{}
	}
	now := time.Now()
	o.states[rank] = stateArrival{state: s, at: now}
	if s.Reason == jobenv.ReasonTimeout && o.onStall != nil {
		o.onStall(now)
	}
}

// statesSince returns the states the ranks reported at or after since, by rank, and the job's size as the
// ranks said it (their announcements and states).
func (o *Output) statesSince(since time.Time) (map[int]jobenv.RankState, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	size := o.ranks.size
	states := map[int]jobenv.RankState{}
	for r, a := range o.states {
		if !a.at.Before(since) {
			states[r] = a.state
			size = max(size, a.state.Size)
		}
	}
	return states, size
}

// say writes a message of the launcher's own on the terminal.
func (o *Output) say(text string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprint(o.stderr, text)
}

// hangAsker asks a running job's ranks for their hang reports and writes the summary, one question at a
// time.
type hangAsker struct {
	out  *Output
	proc *os.Process
	// busy is closed when the question in progress is answered (nil: none in progress); ended is closed
	// when the job ended, and no more answers can come.
	busy  chan struct{}
	ended chan struct{}
}

// ask sends the ranks ReportSignal and, on a goroutine of its own, writes the summary once every rank
// answered, hangAnswerWait passed or the job ended. why says what asked. A question while another is
// in progress is the same question.
func (h *hangAsker) ask(why string, since time.Time) {
	if h.busy != nil {
		select {
		case <-h.busy:
		default:
			return
		}
	}
	_ = h.proc.Signal(ReportSignal)
	busy := make(chan struct{})
	h.busy = busy
	go func() {
		defer close(busy)
		deadline := time.After(hangAnswerWait)
		for {
			states, size := h.out.statesSince(since)
			if size > 0 && len(states) >= size {
				break
			}
			select {
			case <-deadline:
			case <-h.ended:
			case <-time.After(20 * time.Millisecond):
				continue
			}
			break
		}
		states, size := h.out.statesSince(since)
		h.out.say(fmt.Sprintf("accel launch: hang report (%s): what the ranks are doing:\n%s  (each rank's report, "+
			"with its goroutines' stacks: %s)\n", why, indent(HangSummary(size, states)), h.out.logPattern()))
	}()
}

// wait returns once the question in progress, if any, is answered.
func (h *hangAsker) wait() {
	if h.busy != nil {
		<-h.busy
	}
}

func indent(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// HangSummary says, a line each, where the ranks of a job of size ranks stand, from the states of those
// that answered (by rank): which ranks wait in which collective and for how long, which rank has not
// arrived at the collective the others wait in and what it is doing, and which ranks did not answer —
// stopped, or stuck in native code, where a signal handler cannot run.
func HangSummary(size int, states map[int]jobenv.RankState) []string {
	if size == 0 || len(states) == 0 {
		return []string{"no rank answered (stopped or busy in native code, or not a goaccel program)"}
	}
	// Ranks waiting, by the collective they wait in; the highest number is the one the job waits at.
	type group struct {
		seq   int64
		call  string
		bytes int64
		ranks []int
		gave  []int // ranks that gave up at their timeout
		left  []int // ranks that stopped waiting when a rank failed or left
		wait  float64
	}
	var groups []*group
	var target *group
	for _, r := range slices.Sorted(maps.Keys(states)) {
		s := states[r]
		if !s.Stuck() {
			continue
		}
		i := slices.IndexFunc(groups, func(g *group) bool { return g.seq == s.WaitSeq && g.call == s.WaitCall })
		if i < 0 {
			groups = append(groups, &group{seq: s.WaitSeq, call: s.WaitCall, bytes: s.WaitBytes})
			i = len(groups) - 1
		}
		g := groups[i]
		g.ranks = append(g.ranks, r)
		switch {
		case s.TimedOut:
			g.gave = append(g.gave, r)
		case s.Abandoned:
			g.left = append(g.left, r)
		}
		g.wait = max(g.wait, s.WaitedSeconds)
		if target == nil || g.seq > target.seq {
			target = g
		}
	}
	slices.SortStableFunc(groups, func(a, b *group) int { return int(b.seq - a.seq) })
	var lines []string
	for _, g := range groups {
		verb := "wait"
		if len(g.ranks) == 1 {
			verb = "waits"
		}
		line := fmt.Sprintf("%s %s in %s for %s", commaRanks(g.ranks), verb, collective(g.seq, g.call, g.bytes),
			jobenv.Seconds(g.wait))
		var ends []string
		if len(g.gave) > 0 {
			ends = append(ends, commaRanks(g.gave)+" gave up at the timeout")
		}
		if len(g.left) > 0 {
			ends = append(ends, commaRanks(g.left)+" stopped as a rank failed")
		}
		if len(ends) > 0 {
			line += " (" + strings.Join(ends, "; ") + ")"
		}
		lines = append(lines, line)
	}
	for _, r := range slices.Sorted(maps.Keys(states)) {
		s := states[r]
		if s.Stuck() {
			continue
		}
		latest := "it has started no collective yet"
		if s.Seq > 0 {
			latest = fmt.Sprintf("its latest collective is #%d (%s), completed", s.Seq, s.Call)
		}
		doing := ""
		if s.Doing != "" {
			doing = "; it is in " + s.Doing
		}
		if target != nil && s.Seq < target.seq {
			lines = append(lines, fmt.Sprintf("rank %d has not arrived at #%d: %s%s", r, target.seq, latest, doing))
		} else {
			lines = append(lines, fmt.Sprintf("rank %d waits in no collective: %s%s", r, latest, doing))
		}
	}
	var silent []int
	for r := range size {
		if _, ok := states[r]; !ok {
			silent = append(silent, r)
		}
	}
	if len(silent) > 0 {
		line := commaRanks(silent) + " did not answer (stopped or busy in native code)"
		if target != nil {
			has := "has"
			if len(silent) > 1 {
				has = "have"
			}
			line += fmt.Sprintf("; %s not arrived at %s, where %s %s", has, collective(target.seq, target.call, -1),
				commaRanks(target.ranks), map[bool]string{true: "waits", false: "wait"}[len(target.ranks) == 1])
		}
		lines = append(lines, line)
	}
	return lines
}

// collective names a collective as the summary does: "all-reduce #118 (float32[2097152], 8.0 MiB)", or
// "all-reduce #118" when bytes < 0 (named already).
func collective(seq int64, call string, bytes int64) string {
	op, detail, ok := strings.Cut(call, " of ")
	if !ok {
		op, detail = call, ""
	}
	if op == "" {
		op = "collective"
	}
	if bytes < 0 || detail == "" {
		return fmt.Sprintf("%s #%d", op, seq)
	}
	return fmt.Sprintf("%s #%d (%s, %s)", op, seq, detail, jobenv.Bytes(bytes))
}

// commaRanks writes ranks as "rank 1" or "ranks 0, 2, 3": the summary names each rank, as one looks
// for a number among them.
func commaRanks(ranks []int) string {
	words := make([]string, len(ranks))
	for i, r := range ranks {
		words[i] = fmt.Sprint(r)
	}
	if len(ranks) == 1 {
		return "rank " + words[0]
	}
	return "ranks " + strings.Join(words, ", ")
}
