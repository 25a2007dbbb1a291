package accel

import "os"

// observe starts what says where the job stalls or slows: the hang report (hang.go), for a communicator
// this accelerator opened, and the step timing with its straggler checks (stragglers.go).
func (a *Accelerator) observe() {
	if a.ownComm && a.topo.WorldSize > 1 {
		a.startHangReports(os.Stderr)
	}
	a.stragglers = newStragglers(a)
	a.comm.SetBeforeCollective(a.stragglers.beforeCollective)
}

// stopObserving ends the step timing, as the accelerator closes; the hang reports go on (see
// startHangReports).
func (a *Accelerator) stopObserving() {
	if a.stragglers != nil {
		a.comm.SetBeforeCollective(nil)
	}
}
