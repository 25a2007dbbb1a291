package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// TestLaunchUsageErrorIsNotRestarted: a program that refuses its command line (exit code 2 on the job's
// first run) under --max-restarts 3 runs once, its usage text is shown once (not again in a summary), and
// accel launch says it is a usage error, with exit code 2.
func TestLaunchUsageErrorIsNotRestarted(t *testing.T) {
	mpitest.RequireMPIRun(t)
	a, stdout, stderr := newTestApp()
	code := a.run([]string{"launch", "-n", "2", "--max-restarts", "3", "sh", "-c",
		`echo "run $GOACCEL_RESTART_COUNT"; printf 'flag provided but not defined: -nope\nusage: demo [flags]\n  -k int\n' >&2; exit 2`})
	assert.Equal(t, 2, code, "stderr: %s", stderr)
	assert.Equal(t, 2, strings.Count(stdout.String(), "run 0"), stdout.String())
	assert.NotContains(t, stdout.String(), "run 1", "restarted")
	errs := stderr.String()
	assert.NotContains(t, errs, "restarting the job")
	assert.Equal(t, 1, strings.Count(errs, "usage: demo [flags]"), "shown once:\n%s", errs)
	assert.Regexp(t, `accel launch: the job failed \(exit code 2\): (rank \d|a process) exited with code 2, a usage `+
		`error: the program refused its command line, and running it again would not help \(its words are above; `, errs)
	assert.NotContains(t, errs, "what the ranks reported")
}

// TestLaunchRefusesAMissingNetwork: `accel launch --net` naming an interface this machine does not have
// fails with goaccel's sentence before mpirun starts (no banners, no "see mpirun.log").
func TestLaunchRefusesAMissingNetwork(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	script := "#!/bin/sh\necho \"mpirun $*\" >> '" + marker + "'\n" +
		"case \"$1\" in --version) echo 'mpirun (Open MPI) 4.1.2';; esac\nexit 0\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mpirun"), []byte(script), 0o755))
	a, stdout, stderr := newTestApp(launch.WithEnviron([]string{"PATH=" + os.Getenv("PATH")}), launch.WithFlavor(launch.OpenMPI))
	code := a.run([]string{"launch", "--mpirun", filepath.Join(dir, "mpirun"), "--net", "nonexist0", "--", "true"})
	assert.Equal(t, 1, code, "stdout: %s\nstderr: %s", stdout, stderr)
	assert.Contains(t, stderr.String(), `accel launch: network "nonexist0": this machine has no interface of this name, `+
		"and mpirun, which runs here, makes its control connections on it (oob_tcp_if_include); its interfaces are ")
	assert.NotContains(t, stderr.String(), "mpirun.log")
	assert.NoFileExists(t, marker, "mpirun ran")
}
