package launch_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// TestRunDoesNotRestartAUsageError: a job whose first run fails because its processes exit with the
// flag package's code 2 (a program refusing its command line, before any work) is not restarted however
// many restarts are allowed: the same command would be refused again. Run returns 2 and reports the
// failure as a usage error.
func TestRunDoesNotRestartAUsageError(t *testing.T) {
	mpitest.RequireMPIRun(t)
	var out, errOut bytes.Buffer
	restarted := false
	var failure *launch.Failure
	code, err := launch.Run(context.Background(), 2, "sh",
		[]string{"-c", `echo "run $GOACCEL_RESTART_COUNT"; echo "usage: demo [flags]" >&2; exit 2`},
		launch.WithStdio(nil, &out, &errOut), launch.WithMaxRestarts(3),
		launch.WithRestartNotice(func(launch.Restart) { restarted = true }),
		launch.WithFailureNotice(func(f launch.Failure) { failure = &f }))
	require.NoError(t, err)
	assert.Equal(t, launch.UsageExitCode, code)
	assert.False(t, restarted, "a usage error was restarted:\n%s\n%s", &out, &errOut)
	assert.Equal(t, 2, strings.Count(out.String(), "run 0"), "one run of two ranks: %s", &out)
	assert.NotContains(t, out.String(), "run 1")
	require.NotNil(t, failure)
	assert.True(t, failure.Usage)
	assert.Regexp(t, `^(rank \d|a process) exited with code 2, a usage error: the program refused its command line`,
		failure.String())
}

// TestRunRestartsCode2AfterTheFirstRun: on a restarted run the command line was accepted before, so a
// process exiting with 2 is a failure like any other, and the job is restarted.
func TestRunRestartsCode2AfterTheFirstRun(t *testing.T) {
	mpitest.RequireMPIRun(t)
	var out bytes.Buffer
	var notices []launch.Restart
	script := `rank=${OMPI_COMM_WORLD_RANK:-$PMI_RANK}
echo "run $GOACCEL_RESTART_COUNT rank $rank"
case "$GOACCEL_RESTART_COUNT" in
0) [ "$rank" = 1 ] && exit 3; exec sleep 60;;
1) exit 2;;
esac
exit 0`
	code, err := launch.Run(context.Background(), 2, "sh", []string{"-c", script},
		launch.WithStdio(nil, &out, &out), launch.WithMaxRestarts(2),
		launch.WithRestartNotice(func(r launch.Restart) { notices = append(notices, r) }))
	require.NoError(t, err)
	assert.Equal(t, 0, code, out.String())
	require.Len(t, notices, 2, out.String())
	assert.Equal(t, 2, notices[1].Failure.ExitCode)
	assert.False(t, notices[1].Failure.Usage)
}

// TestRunRestartsACrashOnTheFirstRun: Go's runtime exits with 2 after a crash report, as the flag package
// does after a usage error; a first run whose process crashed is restarted, and the restart says it
// crashed.
func TestRunRestartsACrashOnTheFirstRun(t *testing.T) {
	mpitest.RequireMPIRun(t)
	var out bytes.Buffer
	var notices []launch.Restart
	script := `[ "$GOACCEL_RESTART_COUNT" = 0 ] || exit 0
[ "${OMPI_COMM_WORLD_RANK:-$PMI_RANK}" = 1 ] || exec sleep 60
printf 'panic: runtime error: index out of range [3] with length 3\n\ngoroutine 1 [running]:\nmain.main()\n\t/src/train/main.go:12 +0x1d\n' >&2
exit 2`
	code, err := launch.Run(context.Background(), 2, "sh", []string{"-c", script},
		launch.WithStdio(nil, &out, &out), launch.WithMaxRestarts(1),
		launch.WithRestartNotice(func(r launch.Restart) { notices = append(notices, r) }))
	require.NoError(t, err)
	assert.Equal(t, 0, code, out.String())
	require.Len(t, notices, 1, out.String())
	assert.False(t, notices[0].Failure.Usage)
	assert.Regexp(t, `^(rank 1|a process) crashed \(panic: runtime error: index out of range \[3\] with length 3\) and `+
		`exited with code 2; restarting the job \(restart 1 of 1\)$`, notices[0].String())
}
