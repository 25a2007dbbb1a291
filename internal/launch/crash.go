package launch

import (
	"regexp"
	"strings"
)

// A process that crashes writes a report of many lines, of which a few say what happened: Go's runtime
// writes the panic or the signal, then every goroutine's stack (the failing one first), and for a fatal
// signal the registers last; Open MPI's signal handler writes the signal and the C stack, and its error
// handler the MPI call that failed. The last lines of such a report say nothing: these functions find the
// ones that do.
var (
	// goCrashStart is the first line of a Go crash report: a panic, a fatal error, a fatal signal
	// ("SIGSEGV: segmentation violation"), or the signal behind a panic ("[signal SIGSEGV: …]").
	goCrashStart = regexp.MustCompile(`^(panic: |fatal error: |SIG[A-Z0-9]+: [a-z]|\[signal SIG[A-Z0-9]+)`)
	// goCrashDetail are the lines between that first line and the stacks that say more: the signal behind a
	// panic, where the signal arrived, a panic that was re-raised.
	goCrashDetail = regexp.MustCompile(`^(\[signal |PC=|signal arrived during|\tpanic: |panic: )`)
	// goroutineHeader starts a goroutine's stack: "goroutine 1 [running]:", "goroutine 1 gp=0x… m=0 [syscall]:".
	goroutineHeader = regexp.MustCompile(`^goroutine \d+ .*\[.*\]:$`)
	// frameDetail is what follows a stack frame's file and line: "+0x4b fp=0x… sp=0x… pc=0x…".
	frameDetail = regexp.MustCompile(` \+0x[0-9a-f]+( .*)?$`)
	// mpiReport are the lines of Open MPI's signal handler and error handler that matter (after its
	// "[host:pid] " prefix): the signal, its code and address, the failed MPI call and its error.
	mpiReport = regexp.MustCompile(`\*\*\* (An error occurred in|reported by process|on (a NULL )?communicator|MPI_ERR_[A-Z_]+|Unknown error)`)
	// mpiSignal starts the report of Open MPI's signal handler, mpiSignalDetail are its lines that say
	// which signal, mpiFrame the frames of the C stack that follow ("[host:pid] [ 0] /lib/…"), and
	// mpiSignalEnd ends it.
	mpiSignal       = regexp.MustCompile(`\*\*\* Process received signal \*\*\*`)
	mpiSignalDetail = regexp.MustCompile(`\] (Signal|Signal code|Failing at address): `)
	mpiFrame        = regexp.MustCompile(`\[ ?\d+\] \S`)
	mpiSignalEnd    = regexp.MustCompile(`\*\*\* End of error message \*\*\*`)
)

// maxCrashFrames is how many frames of the failing goroutine's stack an excerpt keeps, past those of Go's
// runtime: the call that failed and its caller.
const maxCrashFrames = 2

// crashExcerpt returns the lines of one process's output that say why it crashed: the first line of a Go
// crash report and the details up to the stacks, the failing goroutine's header and its first frames
// outside Go's runtime (each function with its file and line), and the lines of Open MPI's signal and
// error handlers with the first frames of the C stack. It returns nil when the output holds no crash
// report.
func crashExcerpt(lines []string) []string {
	var out []string
	start := -1
	for i, l := range lines {
		if goCrashStart.MatchString(l) {
			start = i
			break
		}
	}
	if start >= 0 {
		out = append(out, lines[start])
		i := start + 1
		for ; i < len(lines) && !goroutineHeader.MatchString(lines[i]); i++ {
			if goCrashDetail.MatchString(lines[i]) && len(out) < 6 {
				out = append(out, lines[i])
			}
		}
		if i < len(lines) {
			out = append(out, lines[i])
			out = append(out, goFrames(lines[i+1:])...)
		}
	}
	inSignal, frames := false, 0
	for _, l := range lines {
		switch {
		case mpiSignal.MatchString(l):
			inSignal, frames = true, 0
			out = append(out, l)
		case mpiSignalEnd.MatchString(l):
			inSignal = false
		case inSignal && mpiSignalDetail.MatchString(l):
			out = append(out, l)
		case inSignal && mpiFrame.MatchString(l) && frames < 4:
			out = append(out, l)
			frames++
		case mpiReport.MatchString(l):
			out = append(out, l)
		}
	}
	return out
}

// goFrames returns the first frames of a goroutine's stack (the lines after its header) that are not Go's
// runtime, after the last panic if there are several, at most maxCrashFrames, each as "  FUNCTION" and
// "    FILE:LINE"; the first two frames when all are the runtime's.
func goFrames(stack []string) []string {
	type frame struct{ fn, file string }
	var frames []frame
	for i := 0; i < len(stack) && strings.TrimSpace(stack[i]) != ""; i++ {
		fn := stack[i]
		if strings.HasPrefix(fn, "created by ") || strings.HasPrefix(fn, "\t") || strings.HasPrefix(fn, "...") {
			break
		}
		f := frame{fn: fn}
		if i+1 < len(stack) && strings.HasPrefix(stack[i+1], "\t") {
			f.file = frameDetail.ReplaceAllString(strings.TrimSpace(stack[i+1]), "")
			i++
		}
		frames = append(frames, f)
	}
	// A panic recovered and raised again (by the testing package, by a deferred handler) starts its stack
	// with the handlers: the call that failed is after the last panic.
	for i := len(frames) - 1; i >= 0; i-- {
		if strings.HasPrefix(frames[i].fn, "panic(") && i+1 < len(frames) {
			frames = frames[i+1:]
			break
		}
	}
	var chosen []frame
	for _, f := range frames {
		if !strings.HasPrefix(f.fn, "runtime.") && !strings.HasPrefix(f.fn, "panic(") && len(chosen) < maxCrashFrames {
			chosen = append(chosen, f)
		}
	}
	if len(chosen) == 0 {
		chosen = frames[:min(len(frames), maxCrashFrames)]
	}
	var out []string
	for _, f := range chosen {
		out = append(out, "  "+f.fn)
		if f.file != "" {
			out = append(out, "    "+f.file)
		}
	}
	return out
}
