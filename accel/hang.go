package accel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/jobenv"
)

// hangReports answers the requests for a hang report: the report signal (ReportSignal, which `accel
// launch` sends every rank when asked with SIGUSR1, when its --timeout passes, or when a rank's
// collective timed out) and this rank's own collective timeouts.
type hangReports struct {
	out  io.Writer
	stop func() // ends the signal's goroutine
	mu   sync.Mutex
}

// startHangReports makes this rank write a hang report (see writeHangReport) on the report signal and
// when one of its collectives times out. Only for a job's communicator that the accelerator opened: the
// signal is the process's, and one process is one rank of the job.
//
// It goes on answering after Close: closing is collective, and a rank waiting there for the others is
// one a report must describe; and a signal that came after the handler was gone would end the process
// (SIGUSR2's default) just as the launcher asks it what it is doing.
func (a *Accelerator) startHangReports(out io.Writer) {
	h := &hangReports{out: out}
	a.hang = h
	a.comm.SetOnTimeout(func(*backends.TimeoutError) { a.writeHangReport(jobenv.ReasonTimeout) })
	h.stop = onReportSignal(func() { a.writeHangReport(jobenv.ReasonAsked) })
}

// writeHangReport writes what this rank is doing to its standard error, in one write: a few lines for
// people (its collective, how long it waits, what the program says it does, every goroutine's stack),
// each line starting with jobenv.ReportLinePrefix, and a last line with the same as a jobenv.RankState for
// the launcher (jobenv.StateLinePrefix).
func (a *Accelerator) writeHangReport(reason string) {
	h := a.hang
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	state := a.rankState(reason, time.Now())
	var b bytes.Buffer
	writeReport(&b, state, goroutineStacks())
	_, _ = h.out.Write(b.Bytes())
}

// rankState is this rank's part of a hang report, at now.
func (a *Accelerator) rankState(reason string, now time.Time) jobenv.RankState {
	act := a.comm.Activity()
	host, _ := os.Hostname()
	s := jobenv.RankState{Rank: a.topo.Rank, Size: a.topo.WorldSize, Reason: reason, Host: host, PID: os.Getpid(),
		Seq: act.Seq, Call: labelledCall(act.Call, act.Label), Bytes: int64(act.Bytes), Waiting: act.Waiting, TimedOut: act.TimedOut,
		Abandoned: act.Abandoned, Doing: act.Context}
	if act.WaitSeq > 0 {
		s.WaitSeq, s.WaitCall, s.WaitBytes = act.WaitSeq, labelledCall(act.WaitCall, act.WaitLabel), int64(act.WaitBytes)
		s.WaitedSeconds = act.Waited(now).Seconds()
	}
	if act.Broken != nil {
		s.Failed = act.Broken.Error()
	}
	return s
}

// labelledCall names what a labelled collective carries before its buffer: "all-reduce of bucket 3:
// float32[2097152]", which the launcher's summary writes "all-reduce #12 (bucket 3: float32[2097152], 8.0 MiB)".
func labelledCall(call string, label backends.Label) string {
	if label.IsZero() {
		return call
	}
	what := label.What
	if label.Index >= 0 {
		what = fmt.Sprintf("%s %d", what, label.Index)
	}
	if op, detail, ok := strings.Cut(call, " of "); ok {
		return op + " of " + what + ": " + detail
	}
	return call + " of " + what
}

// goroutineStacks is every goroutine's stack, as a crash would print it (runtime/pprof's debug=2).
func goroutineStacks() string {
	var b strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&b, 2); err != nil {
		return fmt.Sprintf("(goroutine stacks unavailable: %v)\n", err)
	}
	return b.String()
}

// writeReport writes a rank's hang report: state for people, stacks, and state for the launcher.
func writeReport(w io.Writer, s jobenv.RankState, stacks string) {
	p := jobenv.ReportLinePrefix
	fmt.Fprintf(w, "%srank %d of %d (host %s, PID %d): hang report (%s)\n", p, s.Rank, s.Size, s.Host, s.PID, s.Reason)
	switch {
	case s.Waiting:
		fmt.Fprintf(w, "%srank %d: waits in collective #%d (%s, %s) for %s\n", p, s.Rank, s.WaitSeq, s.WaitCall,
			jobenv.Bytes(s.WaitBytes), jobenv.Seconds(s.WaitedSeconds))
	case s.TimedOut:
		fmt.Fprintf(w, "%srank %d: waited in collective #%d (%s, %s) for %s and gave up (its timeout)\n", p, s.Rank,
			s.WaitSeq, s.WaitCall, jobenv.Bytes(s.WaitBytes), jobenv.Seconds(s.WaitedSeconds))
	case s.Abandoned:
		fmt.Fprintf(w, "%srank %d: waited in collective #%d (%s, %s) for %s and stopped: it failed, or another "+
			"rank failed or left\n", p, s.Rank, s.WaitSeq, s.WaitCall, jobenv.Bytes(s.WaitBytes),
			jobenv.Seconds(s.WaitedSeconds))
	case s.Seq > 0:
		fmt.Fprintf(w, "%srank %d: in no collective; its latest was #%d (%s, %s)\n", p, s.Rank, s.Seq, s.Call,
			jobenv.Bytes(s.Bytes))
	default:
		fmt.Fprintf(w, "%srank %d: in no collective; it has not started one yet\n", p, s.Rank)
	}
	if s.Doing != "" {
		fmt.Fprintf(w, "%srank %d: the program says it is in %s\n", p, s.Rank, s.Doing)
	}
	if s.Failed != "" {
		fmt.Fprintf(w, "%srank %d: its communicator failed: %s\n", p, s.Rank, s.Failed)
	}
	fmt.Fprintf(w, "%srank %d: goroutines:\n", p, s.Rank)
	for line := range strings.Lines(stacks) {
		fmt.Fprintf(w, "%s%s", p, line)
	}
	if !strings.HasSuffix(stacks, "\n") && stacks != "" {
		fmt.Fprintln(w)
	}
	state, _ := json.Marshal(s) // plain values: cannot fail
	fmt.Fprintf(w, "%s%s\n", jobenv.StateLinePrefix, state)
}
