package launch

import (
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFailureWatchReadsMPIRunReports: the failed process is read from what Open MPI 4 and 5 and MPICH's
// Hydra print, and mpirun's own verdict wins over an MPI_Abort line a surviving rank printed first.
func TestFailureWatchReadsMPIRunReports(t *testing.T) {
	for _, tc := range []struct {
		name   string
		output string
		want   string // "" when no failure is reported
	}{
		{"Open MPI 4, killed", `--------------------------------------------------------------------------
mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).
--------------------------------------------------------------------------`, "rank 1 was killed by signal 9 (killed)"},
		{"Open MPI 4, non-zero exit", `--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[2113,1],3]
  Exit code:    3
--------------------------------------------------------------------------`, "rank 3 exited with code 3"},
		{"Open MPI 5, killed", `prterun noticed that process rank 2 with PID 4242 on node n1 exited on signal 15 (Terminated).`,
			"rank 2 was killed by signal 15 (terminated)"},
		{"abort, then mpirun's verdict", `[1,0]<stderr>:MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD with errorcode 1.
mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).`, "rank 1 was killed by signal 9 (killed)"},
		{"abort alone", `[1,1]<stderr>:MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD with errorcode 4.`,
			"rank 1 called MPI_Abort with error code 4"},
		{"Hydra, killed", `===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   RANK 1 PID 7781 RUNNING AT host
=   KILLED BY SIGNAL: 9 (Killed)
===================================================================================`, "rank 1 was killed by signal 9 (killed)"},
		{"Hydra, exit code without a rank", `=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 7781 RUNNING AT host
=   EXIT CODE: 2`, "a process exited with code 2"},
		{"Open MPI 4, a process whose report did not come", `--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------`, "a process was killed by signal 9 (killed)"},
		{"a bad mpirun argument", `mpirun: Error: unknown option "--no-such-flag"
Type 'mpirun --help' for usage.`, ""},
		{"a program's own words", `[1,0]<stdout>:Exit code: 3 is what the demo prints`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w failureWatch
			out := w.tee(nil)
			for _, line := range strings.SplitAfter(tc.output, "\n") {
				_, _ = out.Write([]byte(line))
			}
			_, _ = out.Write([]byte("\n"))
			f, ok := w.failure(137) // mpirun's exit code for a process killed by SIGKILL
			if tc.want == "" {
				assert.False(t, ok, "no failure: %v", f)
				return
			}
			assert.True(t, ok)
			assert.Equal(t, tc.want, f.String())
		})
	}
}

// TestFailureWatchNamesHosts: in a job on several hosts, the failed process's host comes from mpirun's
// report (Open MPI, Hydra); on one host it is left out.
func TestFailureWatchNamesHosts(t *testing.T) {
	for _, tc := range []struct {
		name, output, want string
		hosts              bool
	}{
		{"Open MPI, killed", `mpirun noticed that process rank 1 with PID 16035 on node gac1-h1 exited on signal 9 (Killed).`,
			"rank 1 on host gac1-h1 was killed by signal 9 (killed)", true},
		{"Open MPI, exit", `mpirun noticed that process rank 3 with PID 16035 on node n2 exited with status 4.`,
			"rank 3 on host n2 exited with code 4", true},
		{"Hydra", "=   RANK 1 PID 7781 RUNNING AT node7\n=   KILLED BY SIGNAL: 9 (Killed)",
			"rank 1 on host node7 was killed by signal 9 (killed)", true},
		{"one host", `mpirun noticed that process rank 1 with PID 16035 on node vm exited on signal 9 (Killed).`,
			"rank 1 was killed by signal 9 (killed)", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := failureWatch{namesHosts: tc.hosts}
			_, _ = w.tee(nil).Write([]byte(tc.output + "\n"))
			f, ok := w.failure(137)
			assert.True(t, ok)
			assert.Equal(t, tc.want, f.String())
		})
	}
}

// TestHostWatchReadsMPIRunReports: Open MPI 4's reports of a host whose daemon could not connect, whose
// network has no interface, or whose daemon died name that host; a failure to start daemons that names no
// host says what the launch agent said before it.
func TestHostWatchReadsMPIRunReports(t *testing.T) {
	const dashes = "--------------------------------------------------------------------------\n"
	for _, tc := range []struct {
		name, output string
		host, reason string // the HostError expected; "" reason: none
	}{
		{"a daemon that cannot connect back (a link down)", dashes + `A process or daemon was unable to complete a TCP connection
to another process:
  Local host:    gac1-h1
  Remote host:   gac1-h0
This is usually caused by a firewall on the remote host. Please
check that any firewall (e.g., iptables) has been disabled and
try again.
` + dashes, "gac1-h1", "could not open a TCP connection to gac1-h0"},
		{"a network the host has no interface on", dashes + `WARNING: An invalid value was given for oob_tcp_if_include.  This
value will be ignored.

  Local host: gac1-h1
  Value:      10.213.0.0/24
  Message:    Did not find interface matching this subnet
` + dashes, "gac1-h1", "no working interface on the network 10.213.0.0/24 given for oob_tcp_if_include"},
		{"a daemon that died", dashes + `An ORTE daemon has unexpectedly failed after launch and before
communicating back to mpirun. This could be caused by a number
of factors, including an inability to create a connection back
to mpirun due to a lack of common network interfaces and/or no
route found between them. Please check network connectivity
(including firewalls and network routing requirements).

  HNP daemon   : [[38003,0],0] on node n0
  Remote daemon: [[38003,0],1] on node n1
` + dashes, "n1", "failed after it was started"},
		{"daemons that did not start, no host named", `bash: orted: command not found
` + dashes + `ORTE was unable to reliably start one or more daemons.
This usually is caused by:

* not finding the required libraries and/or binaries on
  one or more nodes. Please check your PATH and LD_LIBRARY_PATH
` + dashes, "", "could not start its daemons on every host (\"unable to reliably start one or more daemons\": a host " +
			"is unreachable, refused the launch agent's login, or lacks Open MPI); before that: bash: orted: command not found"},
		{"a rank's own banner is not a host's", dashes + `An MPI communication peer process has unexpectedly disconnected.
  Local host: n0
` + dashes, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w failureWatch
			_, _ = w.tee(nil).Write([]byte(tc.output))
			herr := w.hostProblem()
			if tc.reason == "" {
				assert.Nil(t, herr)
				return
			}
			require.NotNil(t, herr)
			assert.Equal(t, tc.host, herr.Host)
			assert.Contains(t, herr.Error(), tc.reason)
		})
	}
}

func TestRestartString(t *testing.T) {
	r := Restart{Failure: Failure{Rank: 1, Signal: syscall.SIGKILL}, Count: 1, Max: 3}
	assert.Equal(t, "rank 1 was killed by signal 9 (killed); restarting the job (restart 1 of 3)", r.String())
}
