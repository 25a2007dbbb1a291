package launch

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/jobenv"
)

// TestHangSummary: the summary from sets of rank states: who waits where, who has not arrived and what
// it does, who did not answer.
func TestHangSummary(t *testing.T) {
	waiting := func(rank int, seq int64, secs float64) jobenv.RankState {
		return jobenv.RankState{Rank: rank, Size: 4, Seq: seq, Call: "all-reduce of float32[2097152]", Waiting: true,
			WaitSeq: seq, WaitCall: "all-reduce of float32[2097152]", WaitBytes: 8 << 20, WaitedSeconds: secs,
			Doing: "optimizer step 12"}
	}
	behind := jobenv.RankState{Rank: 1, Size: 4, Seq: 117, Call: "all-reduce of float32[2097152]", WaitSeq: 117,
		WaitCall: "all-reduce of float32[2097152]", WaitBytes: 8 << 20, WaitedSeconds: 0.01,
		Doing: "Backward of micro-batch 471"}
	timedOut := waiting(2, 118, 600)
	timedOut.Waiting, timedOut.TimedOut = false, true
	abandoned := waiting(3, 118, 599.5)
	abandoned.Waiting, abandoned.Abandoned = false, true
	tests := []struct {
		name   string
		size   int
		states []jobenv.RankState
		want   []string
	}{{
		name:   "one rank behind, in its own words",
		size:   4,
		states: []jobenv.RankState{waiting(0, 118, 91.6), behind, waiting(2, 118, 92.2), waiting(3, 118, 90)},
		want: []string{
			"ranks 0, 2, 3 wait in all-reduce #118 (float32[2097152], 8.0 MiB) for 92 s",
			"rank 1 has not arrived at #118: its latest collective is #117 (all-reduce of float32[2097152]), " +
				"completed; it is in Backward of micro-batch 471",
		},
	}, {
		name:   "a rank that did not answer",
		size:   4,
		states: []jobenv.RankState{waiting(0, 118, 6.25), waiting(2, 118, 6.2), waiting(3, 118, 6)},
		want: []string{
			"ranks 0, 2, 3 wait in all-reduce #118 (float32[2097152], 8.0 MiB) for 6.2 s",
			"rank 1 did not answer (stopped or busy in native code); has not arrived at all-reduce #118, where " +
				"ranks 0, 2, 3 wait",
		},
	}, {
		name:   "ranks that gave up are still there for the job",
		size:   4,
		states: []jobenv.RankState{waiting(0, 118, 600), timedOut, abandoned},
		want: []string{
			"ranks 0, 2, 3 wait in all-reduce #118 (float32[2097152], 8.0 MiB) for 600 s (rank 2 gave up at the " +
				"timeout; rank 3 stopped as a rank failed)",
			"rank 1 did not answer (stopped or busy in native code); has not arrived at all-reduce #118, where " +
				"ranks 0, 2, 3 wait",
		},
	}, {
		name: "ranks in different collectives: the job waits at the latest",
		size: 3,
		states: []jobenv.RankState{
			{Rank: 0, Size: 3, Seq: 9, Waiting: true, WaitSeq: 9, WaitCall: "barrier", WaitedSeconds: 3},
			{Rank: 1, Size: 3, Seq: 8, Waiting: true, WaitSeq: 8, WaitCall: "broadcast of float32[10] from root 0",
				WaitBytes: 40, WaitedSeconds: 4},
		},
		want: []string{
			"rank 0 waits in barrier #9 for 3.0 s",
			"rank 1 waits in broadcast #8 (float32[10] from root 0, 40 bytes) for 4.0 s",
			"rank 2 did not answer (stopped or busy in native code); has not arrived at barrier #9, where rank 0 waits",
		},
	}, {
		name: "nobody waits",
		size: 2,
		states: []jobenv.RankState{{Rank: 0, Size: 2, Seq: 4, Call: "barrier", Doing: "evaluation"},
			{Rank: 1, Size: 2}},
		want: []string{
			"rank 0 waits in no collective: its latest collective is #4 (barrier), completed; it is in evaluation",
			"rank 1 waits in no collective: it has started no collective yet",
		},
	}, {
		name:   "several silent ranks",
		size:   4,
		states: []jobenv.RankState{waiting(0, 5, 1)},
		want: []string{
			"rank 0 waits in all-reduce #5 (float32[2097152], 8.0 MiB) for 1.0 s",
			"ranks 1, 2, 3 did not answer (stopped or busy in native code); have not arrived at all-reduce #5, " +
				"where rank 0 waits",
		},
	}, {
		name: "no answer at all",
		size: 2,
		want: []string{"no rank answered (stopped or busy in native code, or not a goaccel program)"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			states := map[int]jobenv.RankState{}
			for _, s := range tt.states {
				states[s.Rank] = s
			}
			assert.Equal(t, tt.want, HangSummary(tt.size, states))
		})
	}
}

// TestOutputReadsStateLines: a rank's report lines stay in its log, its state line is read (a timeout
// tells onStall), and the terminal gets neither.
func TestOutputReadsStateLines(t *testing.T) {
	var stdout, stderr bytes.Buffer
	out, err := NewOutput(t.TempDir(), &stdout, &stderr)
	require.NoError(t, err)
	var stalled []time.Time
	out.onStall = func(at time.Time) { stalled = append(stalled, at) }
	before := time.Now()
	w := out.Stderr()
	fmt.Fprintf(w, "[1,0]<stderr>:%srank 0: waits in collective #3\n", jobenv.ReportLinePrefix)
	fmt.Fprintf(w, "[1,0]<stderr>:%s{\"rank\":0,\"size\":2,\"reason\":%q,\"seq\":3,\"waiting\":true,\"wait_seq\":3}\n",
		jobenv.StateLinePrefix, jobenv.ReasonTimeout)
	fmt.Fprintf(w, "[1,1]<stderr>:%s{\"rank\":0,\"size\":2}\n", jobenv.StateLinePrefix) // another rank's: not taken
	fmt.Fprintln(w, "mpirun: Forwarding signal 12 to job")
	require.NoError(t, out.Close())
	assert.Empty(t, stderr.String(), "nothing on the terminal")
	states, size := out.statesSince(before)
	assert.Equal(t, 2, size)
	assert.Equal(t, map[int]jobenv.RankState{0: {Rank: 0, Size: 2, Reason: jobenv.ReasonTimeout, Seq: 3, Waiting: true,
		WaitSeq: 3}}, states)
	assert.Len(t, stalled, 1)
	later, _ := out.statesSince(time.Now().Add(time.Second))
	assert.Empty(t, later)
}
