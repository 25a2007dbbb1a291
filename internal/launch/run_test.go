package launch_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// These tests start real mpirun jobs of shell commands: they need Open MPI or MPICH installed.

func TestRunStartsEveryRank(t *testing.T) {
	mpitest.RequireMPIRun(t)
	var out bytes.Buffer
	code, err := launch.Run(context.Background(), 2, "sh",
		[]string{"-c", `echo "rank=${OMPI_COMM_WORLD_RANK:-$PMI_RANK}"; exit 0`},
		launch.WithStdio(nil, &out, &out))
	require.NoError(t, err)
	assert.Equal(t, 0, code, out.String())
	lines := strings.Fields(out.String())
	assert.ElementsMatch(t, []string{"rank=0", "rank=1"}, lines, out.String())
}

func TestRunPropagatesExitCode(t *testing.T) {
	mpitest.RequireMPIRun(t)
	tests := []struct {
		name   string
		script string
		want   int
	}{
		{"every rank exits 7", "exit 7", 7},
		{"one rank exits 7", `[ "${OMPI_COMM_WORLD_RANK:-$PMI_RANK}" = 1 ] && exit 7; exit 0`, 7},
		{"all succeed", "true", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			code, err := launch.Run(context.Background(), 2, "sh", []string{"-c", tt.script},
				launch.WithStdio(nil, &out, &out))
			require.NoError(t, err)
			assert.Equal(t, tt.want, code, out.String())
		})
	}
}

func TestCancelEndsTheJob(t *testing.T) {
	mpitest.RequireMPIRun(t)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var out bytes.Buffer
	cmd, err := launch.Command(ctx, 2, "sleep", []string{"60"}, launch.WithStdio(nil, &out, &out))
	require.NoError(t, err)
	start := time.Now()
	err = cmd.Run()
	elapsed := time.Since(start)
	require.Error(t, err)
	assert.NotZero(t, launch.ExitCode(err))
	assert.Less(t, elapsed, 15*time.Second, "cancelling must end mpirun and its ranks:\n%s", out.String())
}

func TestCommandWithoutMPIRun(t *testing.T) {
	_, err := launch.Command(context.Background(), 2, "./train", nil,
		launch.WithMPIRun("goaccel-no-such-mpirun"), launch.WithFlavor(launch.OpenMPI))
	require.ErrorIs(t, err, launch.ErrMPIRunNotFound)
	assert.Contains(t, err.Error(), "apt-get install openmpi-bin libopenmpi-dev")
}

// Argv shows the command line goaccel runs. Detection is pinned here so the output does not depend on the
// machine: normally the flavor comes from `mpirun --version`, root from the user id and the core count
// from the CPUs this process may use.
func ExampleArgv() {
	argv, err := launch.Argv(4, "./train", []string{"-epochs", "3"},
		launch.WithFlavor(launch.OpenMPI),
		launch.WithRunAsRoot(false),
		launch.WithCPUs(2),
		launch.WithoutDefaultMCA(),
		launch.WithEnviron([]string{}), // nothing to forward to other hosts (see WithForwardEnv)
		launch.WithMPIRunArgs("--tag-output"))
	if err != nil {
		panic(err)
	}
	fmt.Println(launch.String(argv))
	// Output: mpirun -np 4 --oversubscribe --bind-to none --tag-output ./train -epochs 3
}

// Command is the same command line as an *exec.Cmd; Run also connects the terminal, forwards Ctrl-C and
// returns the job's exit code.
func ExampleCommand() {
	cmd, err := launch.Command(context.Background(), 2, "./train", nil,
		launch.WithMPIRun("sh"), // stands in for mpirun so the example runs anywhere
		launch.WithFlavor(launch.OpenMPI),
		launch.WithRunAsRoot(true),
		launch.WithCPUs(8),
		launch.WithoutDefaultMCA(),
		launch.WithEnviron([]string{}),
		launch.WithHostfile("testdata/hosts.txt")) // read and checked here: node1 slots=4, node2 slots=4
	if err != nil {
		panic(err)
	}
	fmt.Println(launch.String(cmd.Args))
	// Output: sh -np 2 --hostfile testdata/hosts.txt --allow-run-as-root --bind-to none ./train
}

// TestRunRestartsAFailedJob: a job whose rank 1 kills itself with SIGKILL on its first two runs, while
// rank 0 works on (as in training, until mpirun ends it), is started again, whole, twice; each run's
// processes read the restart count, each restart is announced with the failed rank, and the job ends with
// exit 0.
func TestRunRestartsAFailedJob(t *testing.T) {
	mpitest.RequireMPIRun(t)
	var out bytes.Buffer
	var notices []launch.Restart
	script := `rank=${OMPI_COMM_WORLD_RANK:-$PMI_RANK}
echo "run $GOACCEL_RESTART_COUNT rank $rank"
if [ "$GOACCEL_RESTART_COUNT" -lt 2 ]; then
  if [ "$rank" = 1 ]; then kill -9 $$; fi
  exec sleep 60
fi
exit 0`
	code, err := launch.Run(context.Background(), 2, "sh", []string{"-c", script},
		launch.WithStdio(nil, &out, &out), launch.WithMaxRestarts(3),
		launch.WithRestartNotice(func(r launch.Restart) { notices = append(notices, r) }))
	require.NoError(t, err)
	assert.Equal(t, 0, code, out.String())
	require.Len(t, notices, 2, out.String())
	for i, n := range notices {
		// Open MPI 4.1 names the rank in most runs and only says "1 process returned a non-zero exit code"
		// in the others (measured: 2 runs in 30); the rank, when named, is the right one.
		assert.Regexp(t, fmt.Sprintf(`^(rank 1|a process) was killed by signal 9 \(killed\); restarting the job \(restart %d of 3\)$`, i+1), n.String())
		assert.Contains(t, []int{1, -1}, n.Failure.Rank)
		assert.Equal(t, syscall.SIGKILL, n.Failure.Signal)
	}
	for run := range 3 {
		for rank := range 2 {
			assert.Contains(t, out.String(), fmt.Sprintf("run %d rank %d\n", run, rank))
		}
	}
	assert.NotContains(t, out.String(), "run 3")
}

// TestRunGivesUpAfterMaxRestarts: a rank that always fails is restarted WithMaxRestarts times, and Run
// returns the last run's exit code; the default notice goes to the job's standard error.
func TestRunGivesUpAfterMaxRestarts(t *testing.T) {
	mpitest.RequireMPIRun(t)
	var out, errOut bytes.Buffer
	code, err := launch.Run(context.Background(), 2, "sh",
		[]string{"-c", `echo "run $GOACCEL_RESTART_COUNT"; [ "${OMPI_COMM_WORLD_RANK:-$PMI_RANK}" = 1 ] && exit 3; exec sleep 60`},
		launch.WithStdio(nil, &out, &errOut), launch.WithMaxRestarts(2))
	require.NoError(t, err)
	assert.Equal(t, 3, code)
	assert.Len(t, regexp.MustCompile(`launch: (rank 1|a process) exited with code 3; restarting the job`).FindAllString(errOut.String(), -1), 2, errOut.String())
	assert.Contains(t, errOut.String(), "(restart 2 of 2)")
	assert.Equal(t, 2, strings.Count(out.String(), "run 2"), "three runs of two ranks: %s", out.String())
}

// TestRunDoesNotRestartWhatNeverRan: an mpirun that fails without reporting a failed process (a bad mpirun
// argument) and a program that cannot run are not restarted.
func TestRunDoesNotRestartWhatNeverRan(t *testing.T) {
	mpitest.RequireMPIRun(t)
	var out bytes.Buffer
	restarted := false
	notice := launch.WithRestartNotice(func(launch.Restart) { restarted = true })
	code, err := launch.Run(context.Background(), 2, "true", nil, launch.WithStdio(nil, &out, &out),
		launch.WithMaxRestarts(3), launch.WithMPIRunArgs("--goaccel-no-such-flag"), notice)
	require.NoError(t, err)
	assert.NotZero(t, code, out.String())
	assert.False(t, restarted, "a bad mpirun argument is not restarted: %s", out.String())

	_, err = launch.Run(context.Background(), 2, "goaccel-no-such-program", nil, launch.WithStdio(nil, &out, &out),
		launch.WithMaxRestarts(3), notice)
	var perr *launch.ProgramError
	require.ErrorAs(t, err, &perr)
	assert.False(t, restarted)
}

// With restarts, Open MPI is told to pass the restart count to ranks on other hosts too; Run starts the job
// again, up to three times, when one of its processes fails.
func ExampleWithMaxRestarts() {
	argv, err := launch.Argv(2, "./train", []string{"-resume"},
		launch.WithFlavor(launch.OpenMPI), launch.WithRunAsRoot(false), launch.WithCPUs(2),
		launch.WithoutDefaultMCA(), launch.WithEnviron([]string{}), launch.WithMaxRestarts(3))
	if err != nil {
		panic(err)
	}
	fmt.Println(launch.String(argv))
	// Output: mpirun -np 2 --bind-to none -x GOACCEL_RESTART_COUNT ./train -resume
}

// WithRestartNotice receives each restart. Here a stand-in for mpirun reports, on its first run, that rank
// 1 was killed, as Open MPI does, so the example runs anywhere; with the real mpirun the report comes from
// the job.
func ExampleWithRestartNotice() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	fakeMPIRun := filepath.Join(dir, "mpirun")
	script := `#!/bin/sh
if [ "$GOACCEL_RESTART_COUNT" = 0 ]; then
  echo "mpirun noticed that process rank 1 with PID 0 on node n1 exited on signal 9 (Killed)." >&2
  exit 137
fi
echo "run $GOACCEL_RESTART_COUNT finished"
`
	if err := os.WriteFile(fakeMPIRun, []byte(script), 0o755); err != nil {
		panic(err)
	}
	code, err := launch.Run(context.Background(), 2, "true", nil,
		launch.WithMPIRun(fakeMPIRun), launch.WithFlavor(launch.OpenMPI), launch.WithStdio(nil, os.Stdout, io.Discard),
		launch.WithMaxRestarts(3),
		launch.WithRestartNotice(func(r launch.Restart) {
			fmt.Printf("restart %d of %d after %s (rank %d, signal %d)\n", r.Count, r.Max, r.Failure, r.Failure.Rank,
				r.Failure.Signal)
		}))
	fmt.Println("exit code", code, err)
	// Output:
	// restart 1 of 3 after rank 1 was killed by signal 9 (killed) (rank 1, signal 9)
	// run 1 finished
	// exit code 0 <nil>
}
