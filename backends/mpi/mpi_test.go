package mpi_test

// These tests run real MPI jobs through internal/testing/mpitest: each test re-executes this package's test binary
// as the ranks of `mpirun -np N` (built with -tags mpi by the harness when this binary was not). They go
// through backends.Open("mpi", ...) rather than the cgo symbols, so they compile with and without the tag.

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/backends/enginetest"
	"github.com/goaccel/goaccel/backends/mpi"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

func TestMain(m *testing.M) { mpitest.Main(m) }

// openWorld opens the mpi engine for the topology mpirun gave this rank.
func openWorld(opts ...backends.CommunicatorOption) (*backends.Communicator, backends.Topology, error) {
	topo, err := backends.DetectTopology()
	if err != nil {
		return nil, topo, err
	}
	comm, err := backends.Open("mpi", topo, opts...)
	return comm, topo, err
}

// conformanceReport is what each rank of TestConformance sends back.
type conformanceReport struct {
	Topology       backends.Topology
	LibraryVersion string
	Calls          map[string]int64
}

func TestConformance(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, conformanceRank)
		return
	}
	// 3 as well as 2 and 4: the reduce-scatter's ring keeps one partial sum on 3 ranks, two on more.
	for _, np := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			results := mpitest.Run(t, np, "TestConformance")
			var first conformanceReport
			for rank, r := range results {
				var rep conformanceReport
				require.NoError(t, r.Decode(&rep))
				assert.Equal(t, rank, rep.Topology.Rank)
				assert.Equal(t, np, rep.Topology.WorldSize)
				assert.Equal(t, "openmpi", rep.Topology.Source)
				assert.Contains(t, rep.LibraryVersion, "MPI")
				if rank == 0 {
					first = rep
					assert.Positive(t, rep.Calls["all-reduce"])
				} else {
					assert.Equal(t, first.Calls, rep.Calls, "every rank counts the same collectives")
				}
			}
		})
	}
}

func conformanceRank() (any, error) {
	comm, topo, err := openWorld(backends.WithTimeout(time.Minute))
	if err != nil {
		return nil, err
	}
	var problems []error
	if err := enginetest.Check(comm); err != nil {
		problems = append(problems, err)
	}

	// backends.Open must refuse an engine whose ranks disagree with the launcher's environment.
	wrong := topo
	wrong.WorldSize++
	if c, err := backends.Open("mpi", wrong); err == nil {
		_ = c.Close()
		problems = append(problems, errors.New("Open accepted a topology with the wrong world size"))
	} else if !strings.Contains(err.Error(), "launcher's environment") {
		problems = append(problems, fmt.Errorf("Open with the wrong world size: unexpected error %v", err))
	}

	// With MPI_ERRORS_RETURN, an MPI failure is a Go error carrying MPI_Error_string's text. A root that
	// does not exist is refused by MPI's own argument check, on every rank alike.
	eng, err := backends.OpenEngine("mpi", topo)
	if err != nil {
		return nil, errors.Join(append(problems, err)...)
	}
	if _, err := eng.StartBroadcast(backends.BufferOf([]float32{1}), topo.WorldSize+3); err == nil {
		problems = append(problems, errors.New("MPI_Ibcast accepted root = size+3"))
	} else if msg := strings.ToLower(err.Error()); !strings.Contains(msg, "mpi_ibcast") || !strings.Contains(msg, "root") {
		problems = append(problems, fmt.Errorf("MPI_Ibcast with a bad root: error %q lacks MPI's text", err))
	}
	if err := eng.Close(); err != nil {
		problems = append(problems, err)
	}

	calls := map[string]int64{}
	stats := comm.Stats()
	for op := range backends.Op(len(backends.Stats{}.PerOp)) {
		calls[op.String()] = stats.Of(op).Calls
	}
	if err := comm.Close(); err != nil {
		problems = append(problems, err)
	}
	return conformanceReport{Topology: topo, LibraryVersion: mpi.LibraryVersion(), Calls: calls},
		errors.Join(problems...)
}

// TestDeadRankEndsJob: when a rank dies, the ranks waiting for it in a collective are ended by mpirun,
// promptly, rather than waiting out the collective timeout.
func TestDeadRankEndsJob(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			comm, _, err := openWorld(backends.WithTimeout(2 * time.Minute))
			if err != nil {
				return nil, err
			}
			if comm.Rank() == 1 {
				os.Exit(3)
			}
			err = comm.Barrier()
			return nil, fmt.Errorf("rank %d's barrier returned (%v) although rank 1 died", comm.Rank(), err)
		})
		return
	}
	out := mpitest.Launch(t, 2, t.Name(), mpitest.WithTimeout(time.Minute))
	assert.False(t, out.TimedOut, "mpirun had to be killed:\n%s", out)
	assert.NotZero(t, out.ExitCode, "mpirun must report the dead rank:\n%s", out)
	assert.Less(t, out.Elapsed, 30*time.Second, "mpirun took too long to end the job:\n%s", out)
	assert.Empty(t, out.Results, "no rank may get past the barrier:\n%s", out)
	t.Logf("mpirun exited with %d after %s", out.ExitCode, out.Elapsed)
}

// TestAbortEndsJob: Abort on one rank ends the whole job with the given exit code.
func TestAbortEndsJob(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			comm, _, err := openWorld(backends.WithTimeout(2 * time.Minute))
			if err != nil {
				return nil, err
			}
			if comm.Rank() == 1 {
				time.Sleep(200 * time.Millisecond) // let rank 0 enter the barrier first
				comm.Abort(5)
			}
			err = comm.Barrier()
			return nil, fmt.Errorf("rank %d's barrier returned (%v) although rank 1 aborted", comm.Rank(), err)
		})
		return
	}
	out := mpitest.Launch(t, 2, t.Name(), mpitest.WithTimeout(time.Minute))
	assert.False(t, out.TimedOut, "mpirun had to be killed:\n%s", out)
	assert.Equal(t, 5, out.ExitCode, "mpirun must exit with the abort code:\n%s", out)
	assert.Less(t, out.Elapsed, 30*time.Second, "%s", out)
	assert.Empty(t, out.Results, "%s", out)
}

// TestWatchdogAcrossProcesses: a rank that does not join a collective makes the others' wait fail with a
// *backends.TimeoutError naming the operation, and closing the broken communicator aborts the job.
func TestWatchdogAcrossProcesses(t *testing.T) {
	const timeout = time.Second
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			comm, _, err := openWorld(backends.WithTimeout(timeout))
			if err != nil {
				return nil, err
			}
			if comm.Rank() == 1 {
				// Miss the collective; the job ends when rank 0 gives up and closes.
				time.Sleep(time.Minute)
				return nil, errors.New("rank 1 outlived rank 0's abort")
			}
			start := time.Now()
			err = comm.AllReduceSum(backends.BufferOf(make([]float64, 1000)))
			elapsed := time.Since(start)
			var terr *backends.TimeoutError
			if !errors.As(err, &terr) {
				return nil, fmt.Errorf("want a *backends.TimeoutError, got %v", err)
			}
			// Report before Close, which aborts the job.
			if rerr := mpitest.Report(map[string]any{"op": terr.Op.String(), "elapsed": elapsed.Seconds(),
				"message": terr.Error()}, nil); rerr != nil {
				return nil, rerr
			}
			_ = comm.Close()
			return nil, errors.New("Close of a broken communicator returned instead of aborting the job")
		})
		return
	}
	out := mpitest.Launch(t, 2, t.Name(), mpitest.WithTimeout(time.Minute))
	assert.False(t, out.TimedOut, "%s", out)
	assert.NotZero(t, out.ExitCode, "closing a broken communicator aborts the job:\n%s", out)
	assert.Less(t, out.Elapsed, 30*time.Second, "%s", out)
	r, ok := out.Result(0)
	require.True(t, ok, "rank 0 did not report:\n%s", out)
	require.Empty(t, r.Err, "%s", out)
	var rep struct {
		Op      string
		Elapsed float64
		Message string
	}
	require.NoError(t, r.Decode(&rep))
	assert.Equal(t, "all-reduce", rep.Op)
	assert.GreaterOrEqual(t, rep.Elapsed, timeout.Seconds())
	assert.Less(t, rep.Elapsed, 10*timeout.Seconds())
	assert.Contains(t, rep.Message, "did not complete within 1s")
	// The abort, not rank 1's own end, finished the job: rank 1 never got to report. (mpirun's own
	// "MPI_ABORT was invoked on rank 0" banner is not asserted: Open MPI 4.1 sometimes loses it in
	// "ORTE_ERROR_LOG: Data unpack would read past end of buffer ... show_help.c".)
	_, rank1Reported := out.Result(1)
	assert.False(t, rank1Reported, "rank 1 outlived rank 0's abort:\n%s", out)
}
