package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

var builtMinimal struct {
	once      sync.Once
	dir, path string
	err       error
}

// minimalWithMPI builds examples/minimal, the smallest goaccel program, with the MPI engine, once per test
// binary.
func minimalWithMPI(t *testing.T) string {
	t.Helper()
	mpitest.RequireMPIRun(t)
	builtMinimal.once.Do(func() {
		if builtMinimal.dir, builtMinimal.err = os.MkdirTemp("", "accel-test-minimal-"); builtMinimal.err != nil {
			return
		}
		builtMinimal.path = filepath.Join(builtMinimal.dir, "minimal")
		cmd := exec.Command("go", "build", "-tags", "mpi", "-o", builtMinimal.path, "../../examples/minimal")
		if out, err := cmd.CombinedOutput(); err != nil {
			builtMinimal.err = fmt.Errorf("go build -tags mpi ./examples/minimal: %v\n%s", err, out)
		}
	})
	require.NoError(t, builtMinimal.err)
	return builtMinimal.path
}

// fakeAgent writes the launch agent of docs/launching.md's "Several hosts on one machine": it ignores the
// host and runs the command here, in a fresh environment, as ssh would run it there. It notes each command
// it was given, after the host, in dir/agent.ran.
func fakeAgent(t *testing.T) (agent, ran string) {
	t.Helper()
	dir := t.TempDir()
	ran = filepath.Join(dir, "agent.ran")
	agent = filepath.Join(dir, "fake-ssh")
	script := "#!/bin/sh\n# A launch agent that runs the command on this machine, whatever the host, in a fresh\n" +
		"# environment as ssh gives a login.\n" +
		"echo \"$*\" >> '" + ran + "'\nshift\nexec env -i HOME=\"$HOME\" USER=\"$USER\" PATH=\"$PATH\" sh -c \"$*\"\n"
	require.NoError(t, os.WriteFile(agent, []byte(script), 0o755))
	return agent, ran
}

var learned = regexp.MustCompile(`(?m)^learned y = .*$`)

// TestLaunchSeveralHostsOnOneMachine: `accel launch --hosts 127.0.0.1:2,127.0.0.2:2` with a launch agent
// that runs the command here starts a daemon for 127.0.0.2 through the agent, as on a second host, and the
// smallest goaccel program trains there as on one host with -n 4 (the same line learned after the same
// steps), where Open MPI's shared memory between the two daemons' processes made rank 0 crash with
// SIGSEGV in MPI_Comm_dup. accel launch says that both hosts are this machine, and how the processes
// talk; each process's host and PID are listed as they start.
func TestLaunchSeveralHostsOnOneMachine(t *testing.T) {
	minimal := minimalWithMPI(t)
	a, stdout, stderr := newTestApp()
	require.Equal(t, 0, a.run([]string{"launch", "-n", "4", "--", minimal}), "stderr: %s", stderr)
	oneHost := learned.FindString(stdout.String())
	require.NotEmpty(t, oneHost, stdout.String())

	agent, ran := fakeAgent(t)
	dir := filepath.Join(t.TempDir(), "logs")
	a, stdout, stderr = newTestApp()
	code := a.run([]string{"launch", "--hosts", "127.0.0.1:2,127.0.0.2:2", "--launch-agent", agent, "--output-dir", dir,
		"--", minimal})
	t.Logf("stderr:\n%s", stderr)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", stdout, stderr)
	assert.Equal(t, oneHost, learned.FindString(stdout.String()), "trained as on one host")
	agentRan, err := os.ReadFile(ran)
	require.NoError(t, err)
	// accel launch's probe, then mpirun's daemon.
	assert.Regexp(t, `^127\.0\.0\.2 true\n127\.0\.0\.2 .*orted .*\n$`, string(agentRan),
		"mpirun started 127.0.0.2's daemon through the agent")
	assert.Regexp(t, `accel launch: hosts 127\.0\.0\.1 and 127\.0\.0\.2 both name this machine \(.+\), and mpirun starts `+
		`a daemon for each of 127\.0\.0\.1 \(mpirun itself\) and 127\.0\.0\.2: Open MPI's shared memory cannot join the `+
		`processes of two daemons of one machine \(a rank would crash with SIGSEGV\), so they talk over TCP `+
		`\(--mca btl self,tcp --mca btl_tcp_if_include 127\.0\.0\.0/8 --mca oob_tcp_if_include 127\.0\.0\.0/8\)\n`, stderr.String())
	assert.Contains(t, stderr.String(), "accel launch: the job's 4 process(es), as they started (also in "+
		filepath.Join(dir, "ranks.txt")+"):\n")
	assert.Len(t, regexp.MustCompile(`(?m)^  rank \d  \S+  PID \d+$`).FindAllString(stderr.String(), -1), 4)
}

// TestLaunchSaysWhenMPIRunMergesHosts: names of this machine that mpirun takes for itself (localhost,
// 127.0.0.1) run as one host, silently in mpirun: accel launch says so, once for the check and the job,
// and how to try several hosts on one machine; the command line is mpirun's as before.
func TestLaunchSaysWhenMPIRunMergesHosts(t *testing.T) {
	a, stdout, stderr := newTestApp(pinned...)
	require.Equal(t, 0, a.run([]string{"launch", "--hosts", "localhost:2,127.0.0.1:2", "--check", "--dry-run", "--", "./train"}),
		stderr.String())
	assert.Contains(t, stdout.String(), "\nmpirun -np 4 --host localhost:2,127.0.0.1:2 --bind-to none -x GOMLX_BACKEND ./train\n")
	assert.Equal(t, 1, strings.Count(stderr.String(), "accel launch: hosts localhost and 127.0.0.1 both name this machine"),
		stderr.String())
	assert.Contains(t, stderr.String(), "and mpirun takes each for itself: it runs their processes (4 slots) as one host, "+
		"and starts no daemon through the launch agent. To try the job on several hosts on this machine, name them by "+
		"loopback addresses mpirun does not take for itself (--hosts 127.0.0.2:2,127.0.0.3:2) and give a --launch-agent "+
		"that runs the command here (docs/launching.md, \"Several hosts on one machine\")\n")
}

// TestLaunchCheckKeepsItsLogs: a check that fails keeps what its job wrote under --output-dir, in
// DIR/check/mpirun.log and DIR/check/rank-N.log as a job's, and its error says what the processes and
// mpirun reported (here MPI_Init fails: no transport joins the two processes) and where the logs are;
// without --output-dir they are kept in the temporary directory it names. (What Open MPI writes then
// varies from run to run; TestCheck checks the quoted lines of a crash.)
func TestLaunchCheckKeepsItsLogs(t *testing.T) {
	accel := accelWithMPI(t)
	bad := []string{"--mpirun-arg", "--mca", "--mpirun-arg", "btl", "--mpirun-arg", "self"}
	dir := filepath.Join(t.TempDir(), "out")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(accel, append(append([]string{"launch", "-n", "2"}, bad...), "--output-dir", dir, "--check")...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("stderr:\n%s", stderr.String())
	require.Equal(t, 1, launch.ExitCode(err), "stdout: %s", stdout.String())
	assert.Regexp(t, `accel launch: --check: the check failed.*; (its output|what the processes said):\n  \S`, stderr.String())
	assert.Regexp(t, regexp.QuoteMeta("(every process's whole output: "+filepath.Join(dir, "check", "rank-N.log")+
		", mpirun's: "+filepath.Join(dir, "check", "mpirun.log")+")")+"|"+
		regexp.QuoteMeta("(mpirun's whole output: "+filepath.Join(dir, "check", "mpirun.log")+")"), stderr.String())
	log, err := os.ReadFile(filepath.Join(dir, "check", "mpirun.log"))
	require.NoError(t, err)
	assert.NotEmpty(t, log)

	stdout.Reset()
	stderr.Reset()
	cmd = exec.Command(accel, append(append([]string{"launch", "-n", "2"}, bad...), "--check")...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.Equal(t, 1, launch.ExitCode(cmd.Run()))
	m := regexp.MustCompile(`whole output: (\S+)/check/(rank-N|mpirun)\.log`).FindStringSubmatch(stderr.String())
	require.NotNil(t, m, stderr.String())
	defer os.RemoveAll(m[1])
	assert.FileExists(t, filepath.Join(m[1], "check", "mpirun.log"), "kept: the check failed")
}

// TestLaunchListsTheProcesses: accel launch says each process's host and PID as the job starts, and writes
// them to DIR/ranks.txt: the PIDs are the program's own (each process here writes its $$ to a file).
func TestLaunchListsTheProcesses(t *testing.T) {
	mpitest.RequireMPIRun(t)
	dir, pids := filepath.Join(t.TempDir(), "out"), t.TempDir()
	a, stdout, stderr := newTestApp()
	code := a.run([]string{"launch", "-n", "2", "--output-dir", dir, "--", "sh", "-c",
		`echo "$$" > "$0/pid-$OMPI_COMM_WORLD_RANK"; echo started`, pids})
	require.Equal(t, 0, code, "stderr: %s", stderr)
	assert.Equal(t, "started\nstarted\n", stdout.String(), "the announcements are not the program's output")
	host, err := os.Hostname()
	require.NoError(t, err)
	table := "accel launch: the job's 2 process(es), as they started (also in " + filepath.Join(dir, "ranks.txt") + "):\n"
	file := "# rank host pid\n"
	for rank := range 2 {
		data, err := os.ReadFile(filepath.Join(pids, fmt.Sprintf("pid-%d", rank)))
		require.NoError(t, err)
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		require.NoError(t, err)
		table += fmt.Sprintf("  rank %d  %s  PID %d\n", rank, host, pid)
		file += fmt.Sprintf("%d %s %d\n", rank, host, pid)
	}
	assert.Equal(t, table, stderr.String())
	ranks, err := os.ReadFile(filepath.Join(dir, "ranks.txt"))
	require.NoError(t, err)
	assert.Equal(t, file, string(ranks))
}
