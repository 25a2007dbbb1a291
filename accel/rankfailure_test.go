package accel_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// rankFailureDeadline bounds a whole job in which one rank fails: starting the ranks, the failure, and
// the end of every process. A job that is still running then has hung, and fails the test.
const rankFailureDeadline = 30 * time.Second

const rankFailureText = "data directory /nonexistent does not exist"

// TestMPIRankErrorEndsJob: one rank returns an error before training while the others train. The job must
// end (non-zero) instead of leaving the others in a collective until the watchdog: with CloseWithError the
// others report which rank failed and its error, and the launcher names the failing rank; with a plain
// Close (the error not passed on) the others still stop, saying which rank closed.
func TestMPIRankErrorEndsJob(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			acc, err := accel.New(accel.WithBackend("go"))
			if err != nil {
				return nil, err
			}
			failing := acc.WorldSize() - 1
			var runErr error
			if acc.Rank() == failing {
				runErr = errors.New(rankFailureText)
			} else {
				inputs, labels := testmodel.Data(acc.WorldSize()*2*50, 1)
				_, runErr = testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: 2}.Train(acc)
			}
			if runErr == nil {
				return nil, fmt.Errorf("rank %d finished training although rank %d failed", acc.Rank(), failing)
			}
			// The job ends inside Close on every rank: report first, as a program prints its error first.
			if err := mpitest.Report(runErr.Error(), nil); err != nil {
				return nil, err
			}
			if os.Getenv("GOACCEL_TEST_CLOSE") == "plain" {
				err = acc.Close()
			} else {
				err = acc.CloseWithError(runErr)
			}
			return nil, fmt.Errorf("rank %d: Close returned (%v) instead of ending the failed job", acc.Rank(), err)
		})
		return
	}
	for _, np := range []int{2, 4} {
		for _, closing := range []string{"with-error", "plain"} {
			t.Run(fmt.Sprintf("np=%d/%s", np, closing), func(t *testing.T) {
				failing := np - 1
				out := mpitest.Launch(t, np, t.Name(), mpitest.WithTimeout(rankFailureDeadline),
					mpitest.WithEnv("GOACCEL_TEST_CLOSE="+closing))
				require.False(t, out.TimedOut, "the job hung:\n%s", out)
				assert.NotZero(t, out.ExitCode, "%s", out)
				for r := range np {
					res, ok := out.Result(r)
					require.True(t, ok, "rank %d reported nothing:\n%s", r, out)
					require.Empty(t, res.Err, "rank %d:\n%s", r, out)
					var msg string
					require.NoError(t, res.Decode(&msg))
					if r == failing {
						assert.Equal(t, rankFailureText, msg)
						continue
					}
					if closing == "plain" {
						assert.Contains(t, msg, fmt.Sprintf("rank %d closed its communicator", failing), "rank %d", r)
					} else {
						assert.Contains(t, msg, fmt.Sprintf("rank %d failed: %s", failing, rankFailureText), "rank %d", r)
					}
				}
				if closing != "plain" {
					// The rank that failed first aborts the job: if the launcher names a rank (Open MPI's
					// banner is not always printed when the job ends), it is that one.
					for r := range np {
						if r != failing {
							assert.NotContains(t, out.Stdout+out.Stderr, fmt.Sprintf("MPI_ABORT was invoked on rank %d ", r),
								"the launcher must name the rank that failed first:\n%s", out)
						}
					}
				}
				t.Logf("job of %d ranks ended after %s with exit code %d", np, out.Elapsed.Round(time.Millisecond), out.ExitCode)
			})
		}
	}
}

// TestMPINewFailsOnOneRank: when New fails on one rank (here: an unknown compute backend), New returns the
// error there, and the other ranks, waiting for it in their first collective (New's own, or the next),
// stop with an error naming that rank and its error.
func TestMPINewFailsOnOneRank(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			topo, err := backends.DetectTopology()
			if err != nil {
				return nil, err
			}
			if topo.Rank == topo.WorldSize-1 {
				_, err := accel.New(accel.WithBackend("no-such-backend"))
				if err == nil {
					return nil, errors.New("New accepted an unknown backend")
				}
				if err := mpitest.Report(err.Error(), nil); err != nil {
					return nil, err
				}
				// Exiting ends the job: stay until the others reported what they saw.
				waitForReports(topo.WorldSize)
				return err.Error(), nil
			}
			acc, err := accel.New(accel.WithBackend("go"))
			if err != nil {
				// Under a launcher New runs a collective of its own: the failed rank's error can arrive there.
				// Without an accelerator to close, exiting ends the job: stay until every rank reported.
				if rerr := mpitest.Report(err.Error(), nil); rerr != nil {
					return nil, rerr
				}
				waitForReports(topo.WorldSize)
				return err.Error(), nil
			}
			err = acc.WaitForEveryone()
			if err == nil {
				return nil, errors.New("WaitForEveryone succeeded although a rank failed in New")
			}
			if rerr := mpitest.Report(err.Error(), nil); rerr != nil {
				return nil, rerr
			}
			return nil, acc.CloseWithError(err)
		})
		return
	}
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			out := mpitest.Launch(t, np, t.Name(), mpitest.WithTimeout(rankFailureDeadline))
			require.False(t, out.TimedOut, "the job hung:\n%s", out)
			for r := range np {
				res, ok := out.Result(r)
				require.True(t, ok, "rank %d reported nothing:\n%s", r, out)
				var msg string
				require.NoError(t, res.Decode(&msg), "rank %d: %s", r, res.Err)
				assert.Contains(t, msg, "no-such-backend", "rank %d", r)
				if r != np-1 {
					assert.Contains(t, msg, fmt.Sprintf("rank %d failed: accel:", np-1), "rank %d", r)
				}
			}
		})
	}
}

// waitForReports waits (at most a few seconds) until every rank of a world of size wrote its report.
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
