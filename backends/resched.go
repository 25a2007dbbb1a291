package backends

import _ "unsafe" // go:linkname

// yieldToOwnP passes the calling goroutine through Go's scheduler without waking another thread: the
// runtime's goyield puts it on its own P's run queue and schedules at once, so it goes on, on the same
// thread, with a new time slice (see reschedEvery). runtime.Gosched puts it on the global queue and first
// wakes the thread of an idle P; with every core polling a collective, that thread takes a core from a peer
// rank, and it mostly took the goroutine over (LockOSThread around Gosched keeps the goroutine but puts its
// thread to sleep on every call instead; docs/notes.md, Note [time slices in waits]). goyield is one of the runtime functions Go
// keeps reachable by linkname for other modules, signature unchanged (go.dev/issue/67401); gVisor calls it.
//
//go:linkname yieldToOwnP runtime.goyield
func yieldToOwnP()
