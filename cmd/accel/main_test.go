package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/version"
)

// pinned fixes what launch would otherwise detect, so command lines do not depend on the machine.
var pinned = []launch.Option{
	launch.WithFlavor(launch.OpenMPI), launch.WithRunAsRoot(false), launch.WithCPUs(2), launch.WithoutDefaultMCA(),
	launch.WithEnviron([]string{"GOMLX_BACKEND=go", "HOME=/root"}),
}

func newTestApp(opts ...launch.Option) (*app, *bytes.Buffer, *bytes.Buffer) {
	var stdout, stderr bytes.Buffer
	return &app{stdout: &stdout, stderr: &stderr, launchOptions: opts}, &stdout, &stderr
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{
			name:       "dry run",
			args:       []string{"launch", "-n", "2", "--dry-run", "./train"},
			wantStdout: "mpirun -np 2 --bind-to none -x GOMLX_BACKEND ./train\n",
		},
		{
			name:       "program arguments pass through, flags included",
			args:       []string{"launch", "-n", "4", "--dry-run", "./train", "-n", "5", "--lr=0.1", "--", "x"},
			wantStdout: "mpirun -np 4 --oversubscribe --bind-to none -x GOMLX_BACKEND ./train -n 5 --lr=0.1 -- x\n",
		},
		{
			name:       "double dash ends accel's flags",
			args:       []string{"launch", "--dry-run", "-n=2", "--", "-weird-program", "a b"},
			wantStdout: "mpirun -np 2 --bind-to none -x GOMLX_BACKEND -weird-program 'a b'\n",
		},
		{
			name: "hostfile and repeated mpirun arguments",
			args: []string{"launch", "-n", "8", "--hostfile", "hosts", "--mpirun-arg", "-x",
				"--mpirun-arg", "NCCL_DEBUG", "--dry-run", "./train"},
			wantStdout: "mpirun -np 8 --hostfile hosts --bind-to none -x GOMLX_BACKEND -x NCCL_DEBUG ./train\n",
		},
		{
			name:       "timeline",
			args:       []string{"launch", "-n", "2", "--timeline", "/tmp/job.json", "--dry-run", "./train"},
			wantStdout: "mpirun -np 2 --bind-to none -x GOACCEL_TIMELINE -x GOMLX_BACKEND ./train\n",
		},
		{
			name:       "another launcher",
			args:       []string{"launch", "--mpirun", "/opt/ompi/bin/mpirun", "--dry-run", "./train"},
			wantStdout: "/opt/ompi/bin/mpirun -np 1 --bind-to none -x GOMLX_BACKEND ./train\n",
		},
		{name: "no command", args: nil, wantCode: 2, wantStderr: "Usage:"},
		{name: "unknown command", args: []string{"train"}, wantCode: 2, wantStderr: `unknown command "train"`},
		{name: "help", args: []string{"help"}, wantStdout: "accel launch [-n N] [--hosts NAME:SLOTS,..."},
		{name: "launch without program", args: []string{"launch", "-n", "2"}, wantCode: 2, wantStderr: "missing PROGRAM"},
		{name: "zero processes", args: []string{"launch", "-n", "0", "./train"}, wantCode: 2,
			wantStderr: "-n must be at least 1, got 0"},
		{
			name:       "restarts, torchrun's spelling",
			args:       []string{"launch", "-n", "2", "--max-restarts", "3", "--dry-run", "./train", "-resume"},
			wantStdout: "mpirun -np 2 --bind-to none -x GOACCEL_RESTART_COUNT -x GOMLX_BACKEND ./train -resume\n",
		},
		{
			name:       "restarts, one dash",
			args:       []string{"launch", "-n", "2", "-max-restarts=1", "--dry-run", "./train"},
			wantStdout: "mpirun -np 2 --bind-to none -x GOACCEL_RESTART_COUNT -x GOMLX_BACKEND ./train\n",
		},
		{
			name: "hosts, network, launch agent, more environment",
			args: []string{"launch", "--hosts", "node1:4,node2:4", "--net", "10.0.0.0/24", "--launch-agent", "ssh -p 2222",
				"--env", "OMP_NUM_THREADS=1", "--env", "HOME", "--dry-run", "./train"},
			wantStdout: "mpirun -np 8 --host node1:4,node2:4 --bind-to none --mca plm_rsh_agent 'ssh -p 2222' " +
				"--mca btl_tcp_if_include 10.0.0.0/24 --mca oob_tcp_if_include 10.0.0.0/24 " +
				"-x GOMLX_BACKEND -x HOME -x OMP_NUM_THREADS ./train\n",
		},
		{
			name:       "hosts: fewer processes than slots, never --oversubscribe",
			args:       []string{"launch", "-n", "4", "--hosts", "a:1,b:3", "--dry-run", "./train"},
			wantStdout: "mpirun -np 4 --host a:1,b:3 --bind-to none -x GOMLX_BACKEND ./train\n",
		},
		{
			name:       "hosts passed through as mpirun words: no --oversubscribe",
			args:       []string{"launch", "-n", "4", "--mpirun-arg", "--host", "--mpirun-arg", "a:2,b:2", "--dry-run", "./train"},
			wantStdout: "mpirun -np 4 --bind-to none -x GOMLX_BACKEND --host a:2,b:2 ./train\n",
		},
		{
			name:       "check, then the job: both command lines",
			args:       []string{"launch", "--check", "--hosts", "a,b", "--dry-run", "--", "./train"},
			wantStdout: " check-rank -timeout 3m0s\nmpirun -np 2 --host a:1,b:1 --bind-to none -x GOMLX_BACKEND ./train",
		},
		{name: "more processes than slots", args: []string{"launch", "-n", "3", "--hosts", "a,b", "--dry-run", "./train"},
			wantCode: 1, wantStderr: "accel launch: 3 processes do not fit the 2 slots of hosts a:1,b:1"},
		{name: "empty host list", args: []string{"launch", "--hosts", "", "./train"}, wantCode: 2,
			wantStderr: "accel launch: --hosts is empty: write NAME[:SLOTS],... (node1:4,node2:4), or leave --hosts out"},
		{name: "blank host list, dry run", args: []string{"launch", "--hosts= ", "--dry-run", "./train"}, wantCode: 2,
			wantStderr: "accel launch: --hosts is empty"},
		{name: "empty hostfile name", args: []string{"launch", "--hostfile", "", "./train"}, wantCode: 2,
			wantStderr: "accel launch: --hostfile is empty: name a file of hosts, or leave --hostfile out"},
		{name: "bad host list", args: []string{"launch", "--hosts", "a:0", "./train"}, wantCode: 2,
			wantStderr: `accel launch: --hosts: host "a" in "a:0": slots must be a whole number of at least 1`},
		{name: "bad network", args: []string{"launch", "--net", "10.0.0.0/99", "--dry-run", "./train"}, wantCode: 1,
			wantStderr: `accel launch: network "10.0.0.0/99": "10.0.0.0/99" is not a subnet`},
		{name: "forwarding what is not set", args: []string{"launch", "--env", "NO_SUCH_VARIABLE", "--dry-run", "./train"},
			wantCode: 1, wantStderr: "cannot forward NO_SUCH_VARIABLE: it is not set in the launcher's environment"},
		{name: "negative restarts", args: []string{"launch", "--max-restarts", "-1", "./train"}, wantCode: 2,
			wantStderr: "-max-restarts must be 0 or more, got -1"},
		{name: "bad flag", args: []string{"launch", "--np", "2", "./train"}, wantCode: 2,
			wantStderr: "flag provided but not defined: -np"},
		{name: "launch help", args: []string{"launch", "-h"}, wantStderr: "Usage: accel launch"},
		{name: "env takes no arguments", args: []string{"env", "extra"}, wantCode: 2, wantStderr: "unexpected arguments"},
		{name: "dry run without mpirun", wantCode: 1, wantStderr: "apt-get install openmpi-bin libopenmpi-dev",
			args: []string{"launch", "--mpirun", "goaccel-no-such-mpirun", "--dry-run", "./train"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := pinned
			if strings.Contains(tt.name, "without mpirun") {
				opts = nil // let launch look for the launcher
			}
			a, stdout, stderr := newTestApp(opts...)
			code := a.run(tt.args)
			assert.Equal(t, tt.wantCode, code, "stderr: %s", stderr)
			if tt.wantStdout != "" {
				if strings.HasSuffix(tt.wantStdout, "\n") {
					assert.Equal(t, tt.wantStdout, stdout.String())
				} else {
					assert.Contains(t, stdout.String(), tt.wantStdout)
				}
			}
			assert.Contains(t, stderr.String(), tt.wantStderr)
		})
	}
}

func TestLaunchRunsAndPropagatesExitCode(t *testing.T) {
	mpitest.RequireMPIRun(t)
	a, stdout, stderr := newTestApp()
	code := a.run([]string{"launch", "-n", "2", "sh", "-c",
		`echo "rank ${OMPI_COMM_WORLD_RANK:-$PMI_RANK} of ${OMPI_COMM_WORLD_SIZE:-$PMI_SIZE}"; exit 7`})
	assert.Equal(t, 7, code, "stderr: %s", stderr)
	assert.Contains(t, stdout.String(), "rank 0 of 2")
	assert.Contains(t, stdout.String(), "rank 1 of 2")
}

// TestLaunchRestartsAFailedJob: with --max-restarts, a job whose rank 1 is killed by SIGKILL on its first
// run, while rank 0 works on, is started again and ends with exit 0, the launcher saying which rank failed
// and the restart count; a rank that keeps failing ends the job with its code once the restarts are spent.
func TestLaunchRestartsAFailedJob(t *testing.T) {
	mpitest.RequireMPIRun(t)
	a, stdout, stderr := newTestApp()
	code := a.run([]string{"launch", "-n", "2", "--max-restarts", "2", "sh", "-c",
		`echo "run $GOACCEL_RESTART_COUNT"; [ "$GOACCEL_RESTART_COUNT" = 0 ] || exit 0; [ "$OMPI_COMM_WORLD_RANK" = 1 ] && kill -9 $$; exec sleep 60`})
	assert.Equal(t, 0, code, "stderr: %s", stderr)
	// Open MPI names the rank in most runs, and in the others only says that a process failed.
	assert.Regexp(t, `accel launch: (rank 1|a process) was killed by signal 9 \(killed\); restarting the job \(restart 1 of 2\)\n`, stderr.String())
	assert.NotContains(t, stderr.String(), "restart 2 of 2")
	assert.Equal(t, 2, strings.Count(stdout.String(), "run 1"), "the whole job ran again: %s", stdout)

	a, _, stderr = newTestApp()
	code = a.run([]string{"launch", "-n", "2", "--max-restarts", "1", "sh", "-c",
		`[ "$OMPI_COMM_WORLD_RANK" = 1 ] && echo "demo: rank 1: broken" >&2 && exit 3; exec sleep 60`})
	assert.Equal(t, 3, code)
	assert.Regexp(t, `accel launch: (rank 1|a process) exited with code 3; restarting the job \(restart 1 of 1\)\n`, stderr.String())
	// The failure that ended the job follows, as mpirun reported it.
	assert.Regexp(t, `accel launch: the job failed \(exit code 3\) after 1 restart\(s\): (rank 1|a process) exited with code 3; `+
		`what the ranks reported:`, stderr.String())
}

func TestEnvReport(t *testing.T) {
	// An XLA configuration is named but, without --devices, must not be started (nor downloaded).
	t.Setenv("GOMLX_BACKEND", "xla:cuda")
	t.Setenv(backends.TimeoutEnvVar, "90s")
	a, stdout, stderr := newTestApp()
	require.Equal(t, 0, a.run([]string{"env"}), stderr.String())
	out := stdout.String()
	for _, want := range []string{
		"- goaccel version:       " + version.Release,
		"- Go version:            " + runtime.Version(),
		"- Platform:              " + runtime.GOOS + "/" + runtime.GOARCH,
		fmt.Sprintf("- CPUs:                  %d usable", runtime.NumCPU()),
		"- Topology:              rank 0/1",
		"- Compute backend:       xla:cuda (requested by GOMLX_BACKEND)",
		"- Compute devices:       not started (run `accel env --devices` to start xla:cuda)",
		"GOACCEL_COLLECTIVE_TIMEOUT=90s GOMLX_BACKEND=xla:cuda",
	} {
		assert.Contains(t, out, want)
	}
	if backends.EngineRegistered("mpi") {
		assert.Contains(t, out, "- Collective engines:    mpi, single")
		assert.Regexp(t, `- MPI library: +(Open MPI|MPICH|Intel)`, out)
	} else {
		assert.Contains(t, out, "- Collective engines:    single\n")
		assert.Contains(t, out, "- MPI library:           not linked (build with -tags mpi)")
	}
}

func TestEnvStartsThePureGoBackend(t *testing.T) {
	t.Setenv("GOMLX_BACKEND", cpu.PureGo)
	a, stdout, _ := newTestApp()
	require.Equal(t, 0, a.run([]string{"env"}))
	assert.Regexp(t, `- Compute devices: +1: .*\[#0 `, stdout.String())
}

// `accel launch --dry-run` prints the mpirun command without running it. (The pinned options stand in for
// what accel detects on a real machine: Open MPI, not root, two cores.)
func Example_launch() {
	a := &app{stdout: os.Stdout, stderr: os.Stdout, launchOptions: pinned}
	a.run([]string{"launch", "-n", "4", "--dry-run", "./train", "-epochs", "3"})
	// Output: mpirun -np 4 --oversubscribe --bind-to none -x GOMLX_BACKEND ./train -epochs 3
}

// `accel launch --hosts` runs one process per slot of each host (here 2 × 2), starting the other hosts'
// daemons through the launch agent, with MPI's data and control traffic on one network, and goaccel's and
// GoMLX's variables passed to every host.
func Example_launchOnHosts() {
	a := &app{stdout: os.Stdout, stderr: os.Stdout, launchOptions: pinned}
	a.run([]string{"launch", "--hosts", "node1:2,node2:2", "--net", "10.0.0.0/24", "--launch-agent", "ssh -p 2222",
		"--dry-run", "./train"})
	// Output: mpirun -np 4 --host node1:2,node2:2 --bind-to none --mca plm_rsh_agent 'ssh -p 2222' --mca btl_tcp_if_include 10.0.0.0/24 --mca oob_tcp_if_include 10.0.0.0/24 -x GOMLX_BACKEND ./train
}

// `accel env` reports, in this order:
func Example_env() {
	for _, e := range environmentReport(false) {
		fmt.Println(e.key)
	}
	// Output:
	// goaccel version
	// Go version
	// Platform
	// CPUs
	// Topology
	// Collective engines
	// MPI library
	// mpirun
	// Launcher MCA defaults
	// Configuration
	// Compute backend
	// Compute devices
	// Kernels
	// Gradients
	// Matmul
	// Matmul threads
	// Operations
	// Convolutions
	// Element-wise
	// Gathers and scatters
	// Environment
}

// TestEnvReportsKernels: `accel env` says which gradients, matmul path and thread budget a rank uses, and
// the switches change what it says.
func TestEnvReportsKernels(t *testing.T) {
	t.Setenv("GOMLX_BACKEND", cpu.PureGo)
	report := func() map[string]string {
		out := map[string]string{}
		for _, e := range environmentReport(false) {
			out[e.key] = e.value
		}
		return out
	}
	got := report()
	assert.True(t, strings.HasPrefix(got["Kernels"], "goaccel's"), "this GoMLX is the one the kernels were written for: %s", got["Kernels"])
	assert.Equal(t, "gemm (gradients of matrix products, convolutions and pooling built as matrix products, by goaccel)",
		got["Gradients"], "the line says what the setting means")
	assert.NotEqual(t, "pure Go (simplego)", got["Matmul"])
	t.Setenv(cpu.GradientsEnvVar, "gomlx")
	t.Setenv(cpu.MatmulEnvVar, "go")
	got = report()
	assert.Equal(t, "gomlx (GoMLX's own gradient rules, slower on the pure-Go backend)", got["Gradients"])
	assert.Contains(t, got["Matmul"], "simplego")
	assert.Contains(t, got["Environment"], cpu.MatmulEnvVar+"=go")
	t.Setenv(cpu.GradientsEnvVar, "")
	t.Setenv(cpu.MatmulEnvVar, "")
	assert.True(t, strings.HasPrefix(report()["Gradients"], "gemm ("), "the defaults come back")
	t.Setenv(cpu.ThreadsEnvVar, "1")
	assert.Equal(t, "sequential (one operation of a graph at a time: this rank has one thread)", report()["Operations"])
	t.Setenv(cpu.ThreadsEnvVar, "2")
	assert.True(t, strings.HasPrefix(report()["Operations"], "parallel"), "two threads: the backend's own scheduling")
	assert.True(t, strings.HasPrefix(report()["Convolutions"], "goaccel's executors: "), report()["Convolutions"])
	t.Setenv(cpu.ConvEnvVar, "graph")
	assert.Equal(t, "lowered to slices and dots in the graph", report()["Convolutions"])
	t.Setenv(cpu.ConvEnvVar, "")
	assert.True(t, strings.HasPrefix(report()["Convolutions"], "goaccel's executors: "), "the default comes back")
	assert.True(t, strings.HasPrefix(report()["Element-wise"], "chains of operations fused into single passes, "),
		report()["Element-wise"])
	assert.True(t, strings.HasPrefix(report()["Gathers and scatters"], "gathers and scatter-adds of whole rows"),
		report()["Gathers and scatters"])
}

// TestLaunchProgramThatCannotRun: a missing or non-executable program gets a shell's exit code (127, 126)
// and a message saying so, not mpirun's codes that read as deaths by signal.
func TestLaunchProgramThatCannotRun(t *testing.T) {
	mpitest.RequireMPIRun(t)
	plain := filepath.Join(t.TempDir(), "train")
	require.NoError(t, os.WriteFile(plain, []byte("not a program"), 0o644))
	for _, tc := range []struct {
		name    string
		program string
		code    int
		want    string
	}{
		{"missing", filepath.Join(t.TempDir(), "train"), 127, "accel launch: program"},
		{"not on PATH", "goaccel-no-such-program", 127, "not found"},
		{"not executable", plain, 126, "not executable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _, stderr := newTestApp()
			code := a.run([]string{"launch", "-n", "2", tc.program})
			assert.Equal(t, tc.code, code, "stderr: %s", stderr)
			assert.Contains(t, stderr.String(), tc.want)
			assert.Contains(t, stderr.String(), tc.program)
		})
	}
}

// TestLaunchFailureOutput: 4 ranks that fail alike produce one summary line naming all of them, none of
// mpirun's banner, and every rank's whole output under -output-dir.
func TestLaunchFailureOutput(t *testing.T) {
	mpitest.RequireMPIRun(t)
	dir, ready := filepath.Join(t.TempDir(), "logs"), t.TempDir()
	a, stdout, stderr := newTestApp()
	// Each rank exits once all four have written (on a loaded machine mpirun would otherwise end the last
	// ranks before they start).
	code := a.run([]string{"launch", "-n", "4", "-output-dir", dir, "sh", "-c",
		`echo "step 1"; echo "demo: rank $OMPI_COMM_WORLD_RANK of 4: -k must be at least 1" >&2
touch "$0/$OMPI_COMM_WORLD_RANK"; while [ "$(ls "$0" | wc -l)" -lt 4 ]; do sleep 0.05; done; exit 3`, ready})
	assert.Equal(t, 3, code)
	assert.Equal(t, 4, strings.Count(stdout.String(), "step 1"), "the ranks' standard output passes")
	assert.Regexp(t, `accel launch: the job failed \(exit code 3\): (rank \d|a process) exited with code 3; what the ranks reported:\n`+
		`  ranks 0-3: demo: rank N of 4: -k must be at least 1\n`, stderr.String())
	assert.Equal(t, 2, strings.Count(stderr.String(), "-k must be at least 1"), "once live, once in the summary:\n%s", stderr)
	assert.NotContains(t, stderr.String(), "Primary job", "mpirun's banner restates the failure")
	for rank := range 4 {
		log, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.log", rank)))
		require.NoError(t, err)
		assert.Contains(t, string(log), fmt.Sprintf("stderr: demo: rank %d of 4: -k must be at least 1", rank))
	}
}
