// Package jobenv names the environment variables through which goaccel's launcher speaks to the processes
// it starts. Both sides import it — the launcher sets them, package accel reads them — so neither imports
// the other.
package jobenv

import "fmt"

// RestartCount is set in the environment of every process of a job that the launcher may restart: the
// number of times the job was restarted so far, 0 on the first run, as torchrun's
// TORCHELASTIC_RESTART_COUNT. goaccel programs read it as accel.Accelerator.RestartCount.
const RestartCount = "GOACCEL_RESTART_COUNT"

// Timeline names the file a job's timeline is written to (accel.WithTimeline): `accel launch --timeline
// PATH` sets it for every process of the job.
const Timeline = "GOACCEL_TIMELINE"

// ReportLinePrefix starts every line of a rank's hang report on its standard error: what it is doing and
// its goroutines' stacks. The launcher keeps these lines in the rank's log, off the terminal.
const ReportLinePrefix = "goaccel-report: "

// StateLinePrefix starts the line that ends a rank's hang report: a RankState as JSON, which the launcher
// reads to say which ranks wait in which collective and which has not arrived.
const StateLinePrefix = "goaccel-state: "

// Why a rank reports.
const (
	// ReasonAsked: the rank received the report signal (SIGUSR2), from the launcher or a user.
	ReasonAsked = "asked"
	// ReasonTimeout: one of the rank's collectives ran past its timeout.
	ReasonTimeout = "collective timeout"
)

// RankState is what one rank says about itself in a hang report.
type RankState struct {
	Rank   int    `json:"rank"`
	Size   int    `json:"size"`
	Reason string `json:"reason"`
	Host   string `json:"host,omitempty"`
	PID    int    `json:"pid,omitempty"`
	// Seq is the number of the latest collective the rank started (from 1; 0: none yet), Call what it
	// called there ("all-reduce of float32[2097152]") and Bytes its share.
	Seq   int64  `json:"seq"`
	Call  string `json:"call,omitempty"`
	Bytes int64  `json:"bytes,omitempty"`
	// Waiting: the rank waits for collective WaitSeq (WaitCall, WaitBytes) to complete, for WaitedSeconds
	// so far. TimedOut: it waited there until its timeout and gave up; Abandoned: it stopped waiting there
	// because another rank failed or left. For the job both are the same as waiting: the collective never
	// completed. Otherwise the Wait fields describe the last wait, which completed.
	Waiting       bool    `json:"waiting,omitempty"`
	TimedOut      bool    `json:"timed_out,omitempty"`
	Abandoned     bool    `json:"abandoned,omitempty"`
	WaitSeq       int64   `json:"wait_seq,omitempty"`
	WaitCall      string  `json:"wait_call,omitempty"`
	WaitBytes     int64   `json:"wait_bytes,omitempty"`
	WaitedSeconds float64 `json:"waited_s,omitempty"`
	// Doing is what the program says it is doing (the communicator's describer: "optimizer step 12").
	Doing string `json:"doing,omitempty"`
	// Failed is the error that made the rank's communicator unusable, if any.
	Failed string `json:"failed,omitempty"`
}

// Stuck reports whether the rank is at collective WaitSeq for the job: waiting there, or given up on it.
func (s RankState) Stuck() bool { return s.Waiting || s.TimedOut || s.Abandoned }

// Bytes writes a byte count as the hang reports do: "512 bytes", "4.0 KiB", "8.0 MiB", "1.5 GiB".
func Bytes(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// Seconds writes a wait as the hang reports do: "0.4 s", "6.2 s" under 10 s, "92 s" from there.
func Seconds(s float64) string {
	if s < 10 {
		return fmt.Sprintf("%.1f s", s)
	}
	return fmt.Sprintf("%.0f s", s)
}
