//go:build unix

package accel

import (
	"os"
	"os/signal"
	"syscall"
)

// ReportSignal asks a rank for its hang report: what it is doing, and its goroutines' stacks, on its
// standard error. `accel launch` sends it to every rank (through mpirun, which forwards SIGUSR2 to the
// ranks) when it receives SIGUSR1, when its --timeout passes and when a rank's collective times out. Not
// SIGUSR1: the launcher's guard shell takes that one as the signal that the launcher died.
const ReportSignal = syscall.SIGUSR2

// onReportSignal calls fn, on a goroutine of its own, whenever the process receives ReportSignal, until
// the returned function is called. The goroutine runs whatever the others do: a rank spinning in Go code
// or waiting in a collective still answers; one stopped (SIGSTOP) or stuck in a C call that blocks
// signals does not.
func onReportSignal(fn func()) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, ReportSignal)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				fn()
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}
