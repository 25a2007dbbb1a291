package mpitest_test

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
	_ "github.com/goaccel/goaccel/backends/mpi" // the ranks open nothing, but a real user package would
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

func TestMain(m *testing.M) { mpitest.Main(m) }

// recorder is a testing.TB whose Fatal and Skip are recorded instead of ending the real test, so the
// harness's own failure paths can be checked.
type recorder struct {
	testing.TB
	fatal, skipped string
}

func (r *recorder) Fatal(args ...any) { r.fatal = fmt.Sprint(args...); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any) { r.skipped = fmt.Sprint(args...); runtime.Goexit() }

// record runs fn with a recorder on its own goroutine, where Goexit ends only fn.
func record(t *testing.T, fn func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r
}

func TestRunCollectsEveryRanksReport(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			topo, err := backends.DetectTopology()
			if err != nil {
				return nil, err
			}
			return map[string]any{"square": topo.Rank * topo.Rank, "extra": os.Getenv("MPITEST_EXTRA")}, nil
		})
		return
	}
	results := mpitest.Run(t, 3, t.Name(), mpitest.WithEnv("MPITEST_EXTRA=hello"))
	require.Len(t, results, 3)
	for rank, r := range results {
		assert.Equal(t, rank, r.Rank)
		assert.Equal(t, 3, r.Size)
		var v struct {
			Square int
			Extra  string
		}
		require.NoError(t, r.Decode(&v))
		assert.Equal(t, rank*rank, v.Square)
		assert.Equal(t, "hello", v.Extra)
	}
}

func TestFailingRankFailsRun(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			topo, err := backends.DetectTopology()
			if err != nil {
				return nil, err
			}
			if topo.Rank == 1 {
				return nil, errors.New("boom on purpose")
			}
			return "fine", nil
		})
		return
	}
	out := mpitest.Launch(t, 2, t.Name())
	assert.Equal(t, 1, out.ExitCode, "the failed rank's test exits 1:\n%s", out)
	assert.False(t, out.TimedOut)
	r, ok := out.Result(1)
	require.True(t, ok, "%s", out)
	assert.Equal(t, "boom on purpose", r.Err)
	assert.Contains(t, out.Stdout, "boom on purpose", "the rank's test output reaches the parent")

	rec := record(t, func(tb testing.TB) { mpitest.Run(tb, 2, t.Name()) })
	assert.Contains(t, rec.fatal, "mpirun exited with code 1")
	assert.Contains(t, rec.fatal, "rank 1: boom on purpose")
}

func TestPanickingRankIsReported(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) { panic("kaboom") })
		return
	}
	out := mpitest.Launch(t, 1, t.Name())
	assert.NotZero(t, out.ExitCode)
	r, ok := out.Result(0)
	require.True(t, ok, "%s", out)
	assert.Equal(t, "panic: kaboom", r.Err)
}

func TestTimeoutKillsAHungJob(t *testing.T) {
	if mpitest.IsRank() {
		time.Sleep(time.Minute)
		return
	}
	out := mpitest.Launch(t, 2, t.Name(), mpitest.WithTimeout(2*time.Second))
	assert.True(t, out.TimedOut, "%s", out)
	assert.NotZero(t, out.ExitCode)
	assert.Less(t, out.Elapsed, 20*time.Second, "%s", out)
	assert.Empty(t, out.Results)
}

func TestSubtestsRunAsRanks(t *testing.T) {
	for _, name := range []string{"first case", "second"} {
		t.Run(name, func(t *testing.T) {
			if mpitest.IsRank() {
				mpitest.Do(t, func() (any, error) { return t.Name(), nil })
				return
			}
			results := mpitest.Run(t, 1, t.Name())
			var got string
			require.NoError(t, results[0].Decode(&got))
			assert.Equal(t, t.Name(), got, "only the named subtest ran in the rank")
		})
	}
}

func TestRequireMPIRunWithoutMPI(t *testing.T) {
	if testing.Short() {
		t.Skip("RequireMPIRun skips every test under -short, before it looks for mpirun: nothing to check here")
	}
	t.Setenv("PATH", t.TempDir())
	tests := []struct {
		ci          string
		wantFatal   bool
		wantMessage string
	}{
		{ci: "true", wantFatal: true, wantMessage: "apt-get install openmpi-bin libopenmpi-dev"},
		{ci: "", wantMessage: "apt-get install openmpi-bin libopenmpi-dev"},
		{ci: "false", wantMessage: "mpirun not found"},
	}
	for _, tt := range tests {
		t.Run("CI="+strconv.Quote(tt.ci), func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			rec := record(t, func(tb testing.TB) { mpitest.RequireMPIRun(tb) })
			if tt.wantFatal {
				assert.Contains(t, rec.fatal, tt.wantMessage)
				assert.Empty(t, rec.skipped)
			} else {
				assert.Contains(t, rec.skipped, tt.wantMessage)
				assert.Empty(t, rec.fatal)
			}
		})
	}
}

func TestReportOutsideARank(t *testing.T) {
	if mpitest.IsRank() {
		t.Skip("only meaningful in the parent")
	}
	t.Setenv(mpitest.EnvDir, "")
	require.ErrorContains(t, mpitest.Report(1, nil), "outside a rank")
}

func TestResultDecode(t *testing.T) {
	var n int
	require.ErrorContains(t, mpitest.Result{Rank: 2}.Decode(&n), "rank 2 reported no value")
	require.ErrorContains(t, mpitest.Result{Rank: 1, Value: []byte(`"x"`)}.Decode(&n), "rank 1's value")
	require.NoError(t, mpitest.Result{Value: []byte(`42`)}.Decode(&n))
	assert.Equal(t, 42, n)
}
