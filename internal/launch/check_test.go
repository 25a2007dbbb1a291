package launch_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
	_ "github.com/goaccel/goaccel/backends/mpi" // the check's processes open the MPI engine
	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/launch/rankcheck"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// checkClaimEnvVar makes rank 1 of TestCheck's job claim another build: "goaccel" or "mpi" (goaccel's
// prefix: accel launch forwards it).
const checkClaimEnvVar = "GOACCEL_TEST_CHECK_CLAIM"

// TestCheck: launch.Check on two real MPI processes reports both, with this host's name and their builds,
// and the bandwidth of the all-reduces whose sums it checked; a process claiming another goaccel version
// or MPI library fails the check with a *MismatchError naming both builds (and no all-reduce is run); a
// process that fails ends the check with an error naming its rank.
func TestCheck(t *testing.T) {
	if mpitest.IsRank() {
		checkRank(t)
		return
	}
	mpitest.RequireMPIRun(t)
	binary := mpitest.Binary(t)
	host, err := os.Hostname()
	require.NoError(t, err)
	check := func(t *testing.T, claim string, opts ...launch.Option) (*launch.CheckReport, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Every goroutine in a crash report, as many set it: the lines that matter come first, and many follow.
		env := append(os.Environ(), mpitest.EnvTest+"=TestCheck", checkClaimEnvVar+"="+claim, "GOTRACEBACK=all")
		return launch.Check(ctx, 2, binary, []string{"-test.run=^TestCheck$", "-test.count=1"},
			append([]launch.Option{launch.WithEnviron(env)}, opts...)...)
	}

	t.Run("same build", func(t *testing.T) {
		report, err := check(t, "")
		require.NoError(t, err)
		require.Len(t, report.Ranks, 2)
		for rank, rc := range report.Ranks {
			assert.Equal(t, rank, rc.Rank)
			assert.Equal(t, host, rc.Host)
			assert.Equal(t, "1.2.3", rc.GoaccelVersion)
			assert.Equal(t, "Test MPI 1", rc.MPILibrary)
		}
		require.Len(t, report.AllReduces, len(launch.CheckSizes))
		for i, a := range report.AllReduces {
			assert.Equal(t, launch.CheckSizes[i].Bytes, a.Bytes)
			assert.Positive(t, a.BusBandwidth)
			assert.InDelta(t, float64(a.Bytes)/a.Seconds, a.AlgorithmBandwidth, 1e-6*a.AlgorithmBandwidth)
			assert.InDelta(t, a.AlgorithmBandwidth, a.BusBandwidth, 1e-6*a.BusBandwidth, "2(N−1)/N is 1 for N=2")
		}
		assert.Contains(t, report.String(), fmt.Sprintf("%s  ranks 0-1   goaccel 1.2.3; Test MPI 1", host))
		t.Logf("\n%s", report)
	})
	for _, tc := range []struct{ claim, field, want string }{
		{"goaccel", "goaccel version", `launch: the processes do not run the same goaccel version: "1.2.3" on ` + host +
			` (rank 0), "9.9.9" on ` + host + ` (rank 1); install one build on every host`},
		{"mpi", "MPI library", `launch: the processes do not run the same MPI library: "Test MPI 1" on ` + host +
			` (rank 0), "Other MPI 2" on ` + host + ` (rank 1)`},
	} {
		t.Run("another "+tc.field, func(t *testing.T) {
			report, err := check(t, tc.claim)
			var mismatch *launch.MismatchError
			require.ErrorAs(t, err, &mismatch)
			assert.Equal(t, tc.field, mismatch.Field)
			assert.Contains(t, err.Error(), tc.want)
			require.NotNil(t, report)
			assert.Len(t, report.Ranks, 2)
			assert.Empty(t, report.AllReduces, "different builds run no all-reduce")
		})
	}
	t.Run("a process fails", func(t *testing.T) {
		_, err := check(t, "exit")
		require.Error(t, err)
		assert.Regexp(t, `launch: the check failed: (rank 1|a process) exited with code 3`, err.Error())
	})
	// A process that crashes: the error quotes the panic, the signal and the failing call with its file and
	// line, after the rank, however long the crash report; WithCheckLogs keeps all of it.
	t.Run("a process crashes", func(t *testing.T) {
		logs := filepath.Join(t.TempDir(), "check")
		_, err := check(t, "crash", launch.WithCheckLogs(logs))
		require.Error(t, err)
		msg := err.Error()
		t.Logf("%s", msg)
		// The testing package recovers the panic and raises it again.
		assert.Regexp(t, `launch: the check failed: (rank 1|a process) crashed \(panic: runtime error: invalid memory `+
			`address or nil pointer dereference \[recovered, repanicked\]\) and exited with code 2; what the processes said:\n`+
			`  rank 1: panic: runtime error: invalid memory address or nil pointer dereference \[recovered, repanicked\]\n`+
			`  rank 1: \[signal SIGSEGV: segmentation violation `, msg)
		assert.Regexp(t, `\n  rank 1: goroutine \d+ \[running\]:\n`+
			`  rank 1:   github.com/goaccel/goaccel/internal/launch_test\.crashOnPurpose\(.*\)\n`+
			`  rank 1:     \S+/internal/launch/check_test.go:\d+\n`, msg)
		assert.Contains(t, msg, "(every process's whole output: "+filepath.Join(logs, "rank-N.log")+", mpirun's: "+
			filepath.Join(logs, "mpirun.log")+")")
		log, err := os.ReadFile(filepath.Join(logs, "rank-1.log"))
		require.NoError(t, err)
		assert.Contains(t, string(log), "stderr: panic: runtime error: invalid memory address or nil pointer dereference")
		assert.Greater(t, strings.Count(string(log), "\nstderr: goroutine "), 1, "the whole report, every goroutine:\n%s", log)
		assert.FileExists(t, filepath.Join(logs, "mpirun.log"))
	})
}

// crashOnPurpose dereferences a nil pointer, as a bug would.
//
//go:noinline
func crashOnPurpose(report *launch.CheckReport) int { return len(report.Ranks) }

// checkRank is a process of TestCheck's job.
func checkRank(t *testing.T) {
	claim := os.Getenv(checkClaimEnvVar)
	topo, err := backends.DetectTopology()
	require.NoError(t, err)
	if claim == "exit" && topo.Rank == 1 {
		os.Exit(3)
	}
	if claim == "crash" && topo.Rank == 1 {
		crashOnPurpose(nil)
	}
	comm, err := backends.Open("mpi", topo, backends.WithTimeout(time.Minute))
	require.NoError(t, err)
	info := launch.CheckInfo{GoaccelVersion: "1.2.3", MPILibrary: "Test MPI 1"}
	if topo.Rank == 1 {
		switch claim {
		case "goaccel":
			info.GoaccelVersion = "9.9.9"
		case "mpi":
			info.MPILibrary = "Other MPI 2"
		}
	}
	require.NoError(t, rankcheck.Run(comm, info, os.Stdout))
	require.NoError(t, comm.Close())
}
