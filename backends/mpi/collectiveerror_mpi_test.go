package mpi_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// TestCollectiveErrorNamesTheCallAcrossProcesses: under mpirun with 2 ranks and call checks off (no debug
// mode), rank 0 gathering 2048 bytes per rank while rank 1 gathers 16 makes Open MPI fail the collective
// (MPI_ERR_TRUNCATE) on a rank, or the watchdog end it; a rank whose engine failed it names, beside the
// collective's number, what it called there: "collective #2 (all-gather of uint8[16]) failed on rank 1:
// …(rank 1 was in all-gather of uint8[16]; …)".
func TestCollectiveErrorNamesTheCallAcrossProcesses(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			comm, _, err := openWorld(backends.WithTimeout(5 * time.Second))
			if err != nil {
				return nil, err
			}
			if err := comm.Barrier(); err != nil {
				return nil, err
			}
			n := 2048
			if comm.Rank() == 1 {
				n = 16
			}
			err = comm.AllGather(backends.BufferOf(make([]uint8, n)), backends.BufferOf(make([]uint8, n*comm.Size())))
			msg := ""
			var cerr *backends.CollectiveError
			if errors.As(err, &cerr) {
				msg = err.Error()
			} else if err != nil {
				msg = "not a *CollectiveError: " + err.Error()
			}
			if err := mpitest.Report(msg, nil); err != nil {
				return nil, err
			}
			waitForReports(comm.Size())
			comm.Fail(err)
			_ = comm.Close()
			return msg, nil
		})
		return
	}
	out := mpitest.Launch(t, 2, t.Name(), mpitest.WithTimeout(60*time.Second))
	require.False(t, out.TimedOut, "the job hung:\n%s", out)
	named := 0
	for r := range 2 {
		res, ok := out.Result(r)
		require.True(t, ok, "rank %d reported nothing:\n%s", r, out)
		var msg string
		require.NoError(t, res.Decode(&msg))
		t.Logf("rank %d: %q", r, msg)
		if msg == "" {
			continue // the engine completed it here (the larger blocks' rank may see no error)
		}
		assert.NotContains(t, msg, "not a *CollectiveError", "rank %d", r)
		call := fmt.Sprintf("all-gather of uint8[%d]", map[int]int{0: 2048, 1: 16}[r])
		assert.Contains(t, msg, fmt.Sprintf("collective #2 (%s) failed on rank %d: ", call, r))
		assert.Contains(t, msg, fmt.Sprintf("(rank %d was in %s;", r, call))
		named++
	}
	assert.Positive(t, named, "no rank's engine failed the mismatched collective:\n%s", out)
}

// waitForReports waits, briefly, until every rank reported, so that the first to close does not end the
// job before the others wrote their reports.
func waitForReports(size int) {
	dir := os.Getenv(mpitest.EnvDir)
	for range 500 {
		n, _ := filepath.Glob(filepath.Join(dir, "rank-*.json"))
		if len(n) >= size {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
