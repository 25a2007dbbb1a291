// Package traceevent writes, reads and merges Chrome's trace-event JSON (the "JSON Object Format" that
// Perfetto and chrome://tracing open), and draws one as a PNG: what goaccel's timeline is made of.
package traceevent

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// Event phases this package writes.
const (
	PhaseComplete = "X" // a slice: Ts to Ts+Dur on one thread
	PhaseInstant  = "i" // a moment
	PhaseMetadata = "M" // names and sort order of processes and threads
)

// Event is one trace event. Ts and Dur are in microseconds.
type Event struct {
	Name  string         `json:"name"`
	Cat   string         `json:"cat,omitempty"`
	Ph    string         `json:"ph"`
	Ts    float64        `json:"ts"`
	Dur   float64        `json:"dur,omitempty"`
	Pid   int            `json:"pid"`
	Tid   int            `json:"tid"`
	Scope string         `json:"s,omitempty"`
	Args  map[string]any `json:"args,omitempty"`
}

// End is when a slice ends (Ts for any other event).
func (e Event) End() float64 { return e.Ts + e.Dur }

// File is a trace file: its events, and what the producer says about them (OtherData, which the viewers
// show as the trace's metadata).
type File struct {
	TraceEvents     []Event        `json:"traceEvents"`
	DisplayTimeUnit string         `json:"displayTimeUnit,omitempty"`
	OtherData       map[string]any `json:"otherData,omitempty"`
}

// ProcessName, ThreadName and their sort indices are the metadata events that name a process row
// ("rank 1") and a thread track within it ("training"), and order them.
func ProcessName(pid int, name string) Event {
	return Event{Name: "process_name", Ph: PhaseMetadata, Pid: pid, Args: map[string]any{"name": name}}
}

// ProcessSortIndex orders process rows (lower first).
func ProcessSortIndex(pid, index int) Event {
	return Event{Name: "process_sort_index", Ph: PhaseMetadata, Pid: pid, Args: map[string]any{"sort_index": index}}
}

// ThreadName names a track of a process.
func ThreadName(pid, tid int, name string) Event {
	return Event{Name: "thread_name", Ph: PhaseMetadata, Pid: pid, Tid: tid, Args: map[string]any{"name": name}}
}

// ThreadSortIndex orders the tracks of a process (lower first).
func ThreadSortIndex(pid, tid, index int) Event {
	return Event{Name: "thread_sort_index", Ph: PhaseMetadata, Pid: pid, Tid: tid, Args: map[string]any{"sort_index": index}}
}

// Merge concatenates files into one: metadata first, then every other event by time (a file's events
// keep their order among equal times). It shifts the times so that the earliest event is at 0, since
// viewers handle negative times poorly and the files' clocks were aligned to one process's, which may
// have started after another. OtherData are merged key by key, later files winning.
func Merge(files ...File) File {
	out := File{DisplayTimeUnit: "ms"}
	start := math.Inf(1)
	for _, f := range files {
		for _, e := range f.TraceEvents {
			if e.Ph != PhaseMetadata {
				start = min(start, e.Ts)
			}
			out.TraceEvents = append(out.TraceEvents, e)
		}
		for k, v := range f.OtherData {
			if out.OtherData == nil {
				out.OtherData = map[string]any{}
			}
			out.OtherData[k] = v
		}
	}
	if math.IsInf(start, 1) {
		start = 0
	}
	for i := range out.TraceEvents {
		if out.TraceEvents[i].Ph != PhaseMetadata {
			out.TraceEvents[i].Ts -= start
		}
	}
	slices.SortStableFunc(out.TraceEvents, func(a, b Event) int {
		am, bm := a.Ph == PhaseMetadata, b.Ph == PhaseMetadata
		switch {
		case am && !bm:
			return -1
		case bm && !am:
			return 1
		case am && bm:
			return 0
		}
		switch {
		case a.Ts < b.Ts:
			return -1
		case a.Ts > b.Ts:
			return 1
		}
		return 0
	})
	return out
}

// Encode is f as JSON.
func Encode(f File) ([]byte, error) {
	if f.TraceEvents == nil {
		f.TraceEvents = []Event{}
	}
	return json.Marshal(f)
}

// Decode reads a trace file. A bare array of events (the format's other form) is read too.
func Decode(data []byte) (File, error) {
	var f File
	if err := json.Unmarshal(data, &f); err == nil {
		if f.TraceEvents == nil {
			return f, errors.New("traceevent: no traceEvents in the file")
		}
		return f, nil
	}
	var events []Event
	if err := json.Unmarshal(data, &events); err != nil {
		return File{}, fmt.Errorf("traceevent: not a trace: %w", err)
	}
	return File{TraceEvents: events}, nil
}

// ReadFile reads a trace file from path.
func ReadFile(path string) (File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return File{}, err
	}
	return Decode(data)
}

// WriteFile writes f to path through a temporary file in the same directory renamed over it, so that a
// reader never sees half a trace and a crash leaves the previous file whole.
func WriteFile(path string, f File) error {
	data, err := Encode(f)
	if err != nil {
		return err
	}
	return WriteAtomically(path, data)
}

// WriteAtomically writes data to path through a temporary file renamed over it.
func WriteAtomically(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("traceevent: %w", err)
	}
	_, werr := tmp.Write(data)
	// A temporary file is private (0600); the file it becomes is an ordinary one, readable by others.
	merr := tmp.Chmod(0o644)
	cerr := tmp.Close()
	if err := errors.Join(werr, merr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("traceevent: writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("traceevent: %w", err)
	}
	return nil
}
