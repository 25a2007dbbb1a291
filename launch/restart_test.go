package launch

import (
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
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

func TestRestartString(t *testing.T) {
	r := Restart{Failure: Failure{Rank: 1, Signal: syscall.SIGKILL}, Count: 1, Max: 3}
	assert.Equal(t, "rank 1 was killed by signal 9 (killed); restarting the job (restart 1 of 3)", r.String())
}
