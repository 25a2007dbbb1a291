package launch

import (
	"context"
	"os/exec"
	"syscall"
)

// guardScript runs mpirun ("$@") as the child of a small shell that the kernel signals when the launcher
// dies (SIGUSR1, through the parent-death signal). A launcher killed by SIGKILL cannot pass anything on,
// and mpirun cannot be given the parent-death signal itself: the kernel sends it once per thread of the
// dying Go process that mpirun gets reparented to, and Open MPI's mpirun takes a second SIGTERM as "exit
// now" and leaves the ranks running. The shell turns the repeated signals into exactly one SIGTERM, which
// mpirun answers by ending the job. Other signals it forwards as they come: SIGUSR2 among them, the
// launcher asking the ranks for their hang reports (ReportSignal), which for that reason cannot be the
// parent-death signal, the guard's "end the job". The user asks the launcher with SIGUSR1 (AskSignal), but
// that one reaches the launcher alone, never the guard. stdin is passed on explicitly, because a
// background command's stdin is otherwise /dev/null. It exits with mpirun's status (128+N when
// mpirun died of signal N), as the launcher reports it.
const guardScript = `exec 3<&0
"$@" <&3 3<&- &
child=$!
exec 3<&-
ended=
trap 'if [ -z "$ended" ]; then ended=1; kill -TERM "$child" 2>/dev/null; fi' USR1
trap 'kill -INT "$child" 2>/dev/null' INT
trap 'kill -TERM "$child" 2>/dev/null' TERM
trap 'kill -HUP "$child" 2>/dev/null' HUP
trap 'kill -USR2 "$child" 2>/dev/null' USR2
while :; do
	wait "$child"
	status=$?
	kill -0 "$child" 2>/dev/null || exit "$status"
done`

// guarded returns a command that runs cmd under guardScript, with cmd's environment, streams and
// cancellation: cancelling ctx sends the guard SIGTERM, which it passes on to mpirun.
func guarded(ctx context.Context, cmd *exec.Cmd) *exec.Cmd {
	g := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", guardScript, "goaccel-launch-guard"}, cmd.Args...)...)
	g.Env, g.Stdin, g.Stdout, g.Stderr = cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr
	g.Cancel = func() error { return g.Process.Signal(syscall.SIGTERM) }
	g.WaitDelay = cmd.WaitDelay
	g.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGUSR1}
	return g
}
