package backends

import "syscall"

// yieldProcessor gives the processor to any other runnable thread, of this process or another, without
// sleeping: the polling thread stays runnable. runtime.Gosched would only let other goroutines run, and a
// rank polling for a peer on the same core must let that peer's process run.
func yieldProcessor() { _, _, _ = syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
