package launch_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// TestCheckProgram: a program that cannot run is a *launch.ProgramError with a shell's exit code, before
// mpirun is started (whose own codes, 131 to 134, read as deaths by signal).
func TestCheckProgram(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "data.txt")
	require.NoError(t, os.WriteFile(plain, []byte("not a program"), 0o644))
	script := filepath.Join(dir, "run.sh")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755))
	for _, tc := range []struct {
		name    string
		program string
		code    int // 0: runnable
	}{
		{"executable path", script, 0},
		{"on PATH", "sh", 0},
		{"missing path", filepath.Join(dir, "missing"), launch.ExitNotFound},
		{"not on PATH", "goaccel-no-such-program", launch.ExitNotFound},
		{"not executable", plain, launch.ExitNotExecutable},
		{"a directory", dir, launch.ExitNotExecutable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := launch.CheckProgram(tc.program)
			if tc.code == 0 {
				require.NoError(t, err)
				return
			}
			var perr *launch.ProgramError
			require.ErrorAs(t, err, &perr)
			assert.Equal(t, tc.code, perr.Code)
			assert.Contains(t, err.Error(), tc.program)
			if _, lookErr := exec.LookPath("mpirun"); lookErr == nil {
				_, err := launch.Command(context.Background(), 1, tc.program, nil)
				require.ErrorAs(t, err, &perr, "Command refuses it before starting mpirun")
			}
		})
	}
}

// launcherEnv makes the test binary a launcher (launch.Run of one rank that records its PID and sleeps),
// for TestKilledLauncherEndsTheJob to SIGKILL.
const launcherEnv = "GOACCEL_TEST_LAUNCHER_PIDFILE"

// launcherRestartsEnv gives that launcher WithMaxRestarts of its value.
const launcherRestartsEnv = "GOACCEL_TEST_LAUNCHER_RESTARTS"

func TestMain(m *testing.M) {
	if pidFile := os.Getenv(launcherEnv); pidFile != "" {
		restarts, _ := strconv.Atoi(os.Getenv(launcherRestartsEnv))
		code, err := launch.Run(context.Background(), 1, "sh",
			[]string{"-c", `echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 120`, pidFile},
			launch.WithMaxRestarts(restarts))
		var interrupted *launch.InterruptedError
		if errors.As(err, &interrupted) {
			_, _ = fmt.Fprintln(os.Stderr, err)
		} else if err != nil {
			os.Exit(100)
		}
		os.Exit(code)
	}
	mpitest.Main(m) // removes the mpi-tagged test binary TestCheck may have built
}

// TestKilledLauncherEndsTheJob: a launcher killed with SIGKILL, which it cannot pass on, still ends its job:
// the kernel signals the launcher's guard, which has mpirun end the ranks. A rank left running fails the
// test at its deadline.
func TestKilledLauncherEndsTheJob(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's")
	}
	mpitest.RequireMPIRun(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	launcher, rank := startLauncher(ctx, t, nil)
	waited := make(chan error, 1)
	go func() { waited <- launcher.Wait() }()
	require.NoError(t, launcher.Process.Signal(syscall.SIGKILL))
	<-waited
	waitFor(ctx, t, "the rank to end after its launcher was killed", func() (int, bool) {
		return 0, ended(rank)
	})
}

// TestInterruptedLauncherStopsTheJob: SIGINT or SIGTERM to the launcher ends the job and the launcher
// exits with a shell's code for that signal (130, 143), saying it was interrupted; a launcher that may
// restart the job (WithMaxRestarts) does not restart one it was asked to stop.
func TestInterruptedLauncherStopsTheJob(t *testing.T) {
	mpitest.RequireMPIRun(t)
	for _, tc := range []struct {
		signal   syscall.Signal
		code     int
		name     string
		restarts int
	}{{syscall.SIGINT, 130, "SIGINT", 0}, {syscall.SIGTERM, 143, "SIGTERM", 0},
		{syscall.SIGINT, 130, "SIGINT", 3}, {syscall.SIGTERM, 143, "SIGTERM", 3}} {
		t.Run(fmt.Sprintf("%s/max-restarts=%d", tc.name, tc.restarts), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var stderr strings.Builder
			launcher, rank := startLauncher(ctx, t, &stderr, launcherRestartsEnv+"="+strconv.Itoa(tc.restarts))
			require.NoError(t, launcher.Process.Signal(tc.signal))
			err := launcher.Wait()
			assert.Equal(t, tc.code, launch.ExitCode(err), "the launcher's exit code")
			assert.Contains(t, stderr.String(), "launch: interrupted by "+tc.name+": the job was stopped")
			assert.NotContains(t, stderr.String(), "restarting")
			waitFor(ctx, t, "the rank to end", func() (int, bool) { return 0, ended(rank) })
		})
	}
}

// startLauncher starts this test binary as a launcher of one rank (see TestMain) and waits until the rank
// runs: it returns the launcher and the rank's pid. The launcher's standard error goes to stderr, if given.
func startLauncher(ctx context.Context, t *testing.T, stderr io.Writer, env ...string) (*exec.Cmd, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "rank.pid")
	launcher := exec.Command(os.Args[0], "-test.run=^$")
	launcher.Env = append(append(os.Environ(), launcherEnv+"="+pidFile), env...)
	launcher.Stderr = stderr
	require.NoError(t, launcher.Start())
	rank := waitFor(ctx, t, "the rank to start", func() (int, bool) {
		data, err := os.ReadFile(pidFile)
		if err != nil {
			return 0, false
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		return pid, err == nil
	})
	return launcher, rank
}

// ended reports whether process pid is gone or a zombie (ended, waiting for a parent that may never reap
// it: PID 1 of a container often does not).
func ended(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	// The state follows the command name, which is in parentheses and may contain spaces.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

// waitFor polls until check succeeds, failing the test if ctx ends first.
func waitFor(ctx context.Context, t *testing.T, what string, check func() (int, bool)) int {
	t.Helper()
	for {
		if v, ok := check(); ok {
			return v
		}
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
