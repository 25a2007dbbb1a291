package launch_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/mpitest"
	"github.com/goaccel/goaccel/launch"
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
		launch.WithHostfile("hosts.txt"))
	if err != nil {
		panic(err)
	}
	fmt.Println(launch.String(cmd.Args))
	// Output: sh -np 2 --hostfile hosts.txt --allow-run-as-root --bind-to none ./train
}
