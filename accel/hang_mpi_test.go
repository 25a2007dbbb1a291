package accel_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// hangRank is what a rank of the hang tests reports before it stops or spins: its latest collective.
type hangRank struct {
	Seq int64
	PID int
}

// launched is a job run by launch.Run as `accel launch` runs it: tagged output sorted by launch.Output,
// processes announced, hang reports on.
type launched struct {
	code     int
	err      error
	terminal string // what the launcher wrote on its terminal's standard error
	logs     string // the job's output directory
	reports  string // the directory of the ranks' mpitest reports
}

// launchJob runs the test as np ranks; watch, if not nil, runs meanwhile on a goroutine of its own with the
// directory of the ranks' reports, until the job ends (its channel closes).
func launchJob(t *testing.T, np int, watch func(reports string, ended <-chan struct{}), opts ...launch.Option) *launched {
	t.Helper()
	mpitest.RequireMPIRun(t)
	binary := mpitest.Binary(t)
	res := &launched{logs: t.TempDir(), reports: t.TempDir()}
	if watch != nil {
		ended, watched := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(watched)
			watch(res.reports, ended)
		}()
		defer func() {
			close(ended)
			<-watched
		}()
	}
	var stdout, stderr bytes.Buffer
	out, err := launch.NewOutput(res.logs, &stdout, &stderr)
	require.NoError(t, err)
	environ := append(os.Environ(), mpitest.EnvTest+"="+t.Name(), mpitest.EnvDir+"="+res.reports)
	// Whatever happens, no rank outlives the test: a stopped one cannot end itself.
	t.Cleanup(func() { killReportedRanks(res.reports) })
	opts = append([]launch.Option{launch.WithEnviron(environ), launch.WithTaggedOutput(),
		launch.WithRankAnnouncements(), launch.WithStdio(nil, out.Stdout(), out.Stderr()), launch.WithHangReports(out)},
		opts...)
	res.code, res.err = launch.Run(context.Background(), np, binary,
		[]string{"-test.run=^" + regexp.QuoteMeta(t.Name()) + "$", "-test.count=1"}, opts...)
	require.NoError(t, out.Close())
	res.terminal = stderr.String()
	return res
}

// killReportedRanks kills the processes whose PIDs the ranks reported, if they still run.
func killReportedRanks(dir string) {
	paths, _ := filepath.Glob(filepath.Join(dir, "pid-*"))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && perr == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// writePID leaves this rank's PID for killReportedRanks.
func writePID(rank int) error {
	return os.WriteFile(filepath.Join(os.Getenv(mpitest.EnvDir), fmt.Sprintf("pid-%d", rank)),
		[]byte(strconv.Itoa(os.Getpid())), 0o644)
}

// TestHangReportNamesAStoppedRank: 4 ranks, rank 1 stopped (SIGSTOP) while the others wait in an
// all-reduce until their collective timeout. The first timeout makes the launcher ask every rank; the
// summary names the three waiting ranks, the all-reduce's number and size, and rank 1 as the rank that did
// not answer and has not arrived there.
func TestHangReportNamesAStoppedRank(t *testing.T) {
	if mpitest.IsRank() {
		acc, err := accel.New(accel.WithCollectiveTimeout(5 * time.Second))
		require.NoError(t, err)
		comm := acc.Communicator()
		require.NoError(t, comm.Barrier())
		require.NoError(t, writePID(acc.Rank()))
		seq := comm.Activity().Seq
		if acc.Rank() == 1 {
			require.NoError(t, mpitest.Report(hangRank{Seq: seq, PID: os.Getpid()}, nil))
			require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGSTOP))
			select {} // never reached before mpirun kills it
		}
		err = comm.AllReduceSum(backends.BufferOf(make([]float32, 1<<20)))
		require.NoError(t, mpitest.Report(hangRank{Seq: seq, PID: os.Getpid()}, err))
		_ = acc.CloseWithError(err)
		return
	}
	job := launchJob(t, 4, nil, launch.WithJobTimeout(90*time.Second))
	assert.NotEqual(t, 0, job.code, "the waiting ranks abort the job")
	var seqs [4]int64
	for r := range 4 {
		data, err := os.ReadFile(filepath.Join(job.reports, fmt.Sprintf("rank-%d.json", r)))
		require.NoError(t, err, "rank %d's report\n%s", r, job.terminal)
		var res mpitest.Result
		require.NoError(t, json.Unmarshal(data, &res))
		var hr hangRank
		require.NoError(t, res.Decode(&hr))
		seqs[r] = hr.Seq
	}
	assert.Equal(t, []int64{seqs[0], seqs[0], seqs[0]}, []int64{seqs[1], seqs[2], seqs[3]}, "in step before the all-reduce")
	n := seqs[0] + 1
	want := fmt.Sprintf("accel launch: hang report (a rank's collective timed out): what the ranks are doing:\n"+
		"  ranks 0, 2, 3 wait in all-reduce #%d (float32[1048576], 4.0 MiB) for 5.", n)
	assert.Contains(t, job.terminal, want)
	assert.Contains(t, job.terminal, fmt.Sprintf("  rank 1 did not answer (stopped or busy in native code); "+
		"has not arrived at all-reduce #%d, where ranks 0, 2, 3 wait\n", n))
	assert.Equal(t, 1, strings.Count(job.terminal, "accel launch: hang report"), "one summary:\n%s", job.terminal)
	assert.NotContains(t, job.terminal, "goaccel-report:", "the reports stay in the logs")
	// Each waiting rank's own report, in its log.
	for _, r := range []int{0, 2, 3} {
		log, err := os.ReadFile(filepath.Join(job.logs, fmt.Sprintf("rank-%d.log", r)))
		require.NoError(t, err)
		// The first rank to time out gives up; the others stop waiting as it fails, or still wait when asked.
		assert.Regexp(t, fmt.Sprintf(`goaccel-report: rank %d: (waits|waited) in collective #%d \(all-reduce of `+
			`float32\[1048576\], 4\.0 MiB\) for \d\.\d s( and gave up \(its timeout\)| and stopped: it failed, or `+
			`another rank failed or left)?\n`, r, n), string(log))
		assert.Contains(t, string(log), "goaccel-report: goroutine ", "the stacks")
	}
	t.Logf("the launcher's terminal:\n%s", job.terminal)
}

// spinBeforeAllReduce is a rank's endless loop in Go code, by a name its stack shows.
//
//go:noinline
func spinBeforeAllReduce(stop time.Time) int {
	n := 0
	for time.Now().Before(stop) {
		n++
	}
	return n
}

// TestHangReportOfABusyRank: 2 ranks, rank 1 spinning in Go code while rank 0 waits in an all-reduce. A
// SIGUSR1 to the launcher brings a summary while the job runs on; the launcher's timeout brings another
// and stops the job (exit code 124). The busy rank answers: the summary says which collective it has not
// reached and what it is doing, and its report shows the loop in its stack.
func TestHangReportOfABusyRank(t *testing.T) {
	if mpitest.IsRank() {
		acc, err := accel.New(accel.WithCollectiveTimeout(5 * time.Minute))
		require.NoError(t, err)
		comm := acc.Communicator()
		require.NoError(t, comm.Barrier())
		require.NoError(t, writePID(acc.Rank()))
		if acc.Rank() == 1 {
			require.NoError(t, os.WriteFile(filepath.Join(os.Getenv(mpitest.EnvDir), "spinning"), nil, 0o644))
			spinBeforeAllReduce(time.Now().Add(5 * time.Minute))
		}
		err = comm.AllReduceSum(backends.BufferOf(make([]float64, 1000)))
		_ = acc.CloseWithError(err)
		return
	}
	// Ask once rank 1 spins and rank 0 had time to begin its wait.
	ask := func(reports string, ended <-chan struct{}) {
		for {
			select {
			case <-ended:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := os.Stat(filepath.Join(reports, "spinning")); err == nil {
				time.Sleep(1500 * time.Millisecond)
				assert.NoError(t, syscall.Kill(os.Getpid(), launch.AskSignal))
				return
			}
		}
	}
	job := launchJob(t, 2, ask, launch.WithJobTimeout(15*time.Second))
	assert.Equal(t, launch.JobTimeoutExitCode, job.code)
	var terr *launch.JobTimeoutError
	require.ErrorAs(t, job.err, &terr)

	summary := regexp.MustCompile(`accel launch: hang report \(([^)]*)\): what the ranks are doing:\n` +
		`  rank 0 waits in all-reduce #(\d+) \(float64\[1000\], 7\.8 KiB\) for \d+(?:\.\d)? s\n` +
		`  rank 1 has not arrived at #(\d+): its latest collective is #(\d+) \(barrier\), completed; ` +
		`it is in optimizer step 1\n`)
	found := summary.FindAllStringSubmatch(job.terminal, -1)
	require.Len(t, found, 2, "two summaries:\n%s", job.terminal)
	assert.Equal(t, "asked with SIGUSR1", found[0][1])
	assert.Equal(t, "the job ran past its timeout, 15s", found[1][1])
	for _, m := range found {
		n, _ := strconv.Atoi(m[2])
		assert.Equal(t, m[2], m[3], "rank 1 has not arrived where rank 0 waits")
		assert.Equal(t, strconv.Itoa(n-1), m[4], "rank 1's latest is the one before")
	}
	log, err := os.ReadFile(filepath.Join(job.logs, "rank-1.log"))
	require.NoError(t, err)
	assert.Contains(t, string(log), "goaccel-report: rank 1: in no collective; its latest was #")
	assert.Contains(t, string(log), "goaccel-report: rank 1: the program says it is in optimizer step 1")
	assert.Regexp(t, `goaccel-report: \S*accel_test\.spinBeforeAllReduce\(`, string(log), "the loop, in rank 1's stack")
	t.Logf("rank 1's log, its first report's lines:\n%s", firstReport(string(log)))
	t.Logf("the launcher's terminal:\n%s", job.terminal)
}

// firstReport is the first hang report in a rank's log, as the rank wrote it, for the test's log.
func firstReport(log string) string {
	var b strings.Builder
	for line := range strings.Lines(log) {
		text := strings.TrimPrefix(line, "stderr: ")
		if strings.HasPrefix(text, "goaccel-report: ") || strings.HasPrefix(text, "goaccel-state: ") {
			b.WriteString(text)
		}
		if strings.HasPrefix(text, "goaccel-state: ") {
			break
		}
	}
	return b.String()
}
