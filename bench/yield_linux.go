package bench

import "syscall"

// schedYield gives the processor to another runnable thread of any process, as Open MPI's progress loop
// does when it runs oversubscribed (mpi_yield_when_idle), without sleeping: the thread stays runnable.
func schedYield() { _, _, _ = syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
