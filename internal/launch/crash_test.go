package launch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCrashExcerpt: of a crash report, the excerpt keeps the lines that say what happened and where,
// whatever follows: Go's fatal signal in C code (then every goroutine and the registers), Go's panic (then
// the other goroutines, with GOTRACEBACK=all), Open MPI's signal handler on a C program, and Open MPI's
// error handler. Output without a crash report has none.
func TestCrashExcerpt(t *testing.T) {
	for _, tc := range []struct {
		file string
		want []string
	}{
		{"go-cgo-sigsegv.txt", []string{
			"SIGSEGV: segmentation violation",
			"PC=0x7f95d00bdc04 m=0 sigcode=1 addr=0x42482ca0",
			"signal arrived during cgo execution",
			"goroutine 1 gp=0x3693260441e0 m=0 mp=0x1491b20 [syscall]:",
			"  github.com/goaccel/goaccel/backends/mpi._Cfunc_goaccel_test(0x292f6940, 0x3693262be3fc, 0x30d40)",
			"    _cgo_gotypes.go:462",
			"  github.com/goaccel/goaccel/backends/mpi.(*request).Test.func1(...)",
			"    /work/main/backends/mpi/mpi.go:523",
		}},
		{"go-panic.txt", []string{
			"panic: runtime error: invalid memory address or nil pointer dereference",
			"[signal SIGSEGV: segmentation violation code=0x1 addr=0x8 pc=0x49e495]",
			"goroutine 1 [running]:",
			"  main.step(...)",
			"    /home/user/train/main.go:10",
			"  main.main()",
			"    /home/user/train/main.go:16",
		}},
		{"ompi-sigsegv.txt", []string{
			"[vm:19769] *** Process received signal ***",
			"[vm:19769] Signal: Segmentation fault (11)",
			"[vm:19769] Signal code: Address not mapped (1)",
			"[vm:19769] Failing at address: (nil)",
			"[vm:19769] [ 0] /lib/x86_64-linux-gnu/libc.so.6(+0x3c050)[0x7f300b0e8050]",
			"[vm:19769] [ 1] ./segv(+0x11b5)[0x55af8d8861b5]",
			"[vm:19769] [ 2] /lib/x86_64-linux-gnu/libc.so.6(+0x2724a)[0x7f300b0d324a]",
			"[vm:19769] [ 3] /lib/x86_64-linux-gnu/libc.so.6(__libc_start_main+0x85)[0x7f300b0d3305]",
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "crash", tc.file))
			require.NoError(t, err)
			lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
			if strings.HasPrefix(tc.file, "go-") {
				assert.Greater(t, len(lines), 15, "a report longer than the 15 lines a check used to show")
			}
			assert.Equal(t, tc.want, crashExcerpt(lines))
		})
	}
	mpiError := []string{
		"[vm:19844] *** An error occurred in MPI_Init",
		"[vm:19844] *** reported by process [562167809,0]",
		"[vm:19844] *** on a NULL communicator",
		"[vm:19844] *** Unknown error",
		"[vm:19844] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,",
	}
	assert.Equal(t, mpiError[:4], crashExcerpt(mpiError))
	assert.Nil(t, crashExcerpt([]string{"epoch 1", "[3] done", "Signal: none", "panicking: no", "error: bad"}))
	// All frames in the runtime: the first two.
	assert.Equal(t, []string{"fatal error: all goroutines are asleep - deadlock!", "goroutine 1 [chan receive]:",
		"  runtime.gopark(0x0?)", "    /usr/local/go/src/runtime/proc.go:460", "  runtime.chanrecv1(0x0?)",
		"    /usr/local/go/src/runtime/chan.go:506"},
		crashExcerpt([]string{"fatal error: all goroutines are asleep - deadlock!", "", "goroutine 1 [chan receive]:",
			"runtime.gopark(0x0?)", "\t/usr/local/go/src/runtime/proc.go:460 +0xce", "runtime.chanrecv1(0x0?)",
			"\t/usr/local/go/src/runtime/chan.go:506 +0x12", "runtime.main()", "\t/usr/local/go/src/runtime/proc.go:290"}))
}

// TestFailureWatchSeesACrash: a process that exits with code 2 after a Go crash report crashed, and is no
// usage error (Go's runtime exits with 2, as the flag package does); a first line alone, with no goroutine
// after it, is the program's own words.
func TestFailureWatchSeesACrash(t *testing.T) {
	watch := func(lines ...string) Failure {
		var w failureWatch
		for _, l := range lines {
			w.line(l)
		}
		f, ok := w.failure(2)
		require.True(t, ok)
		return f
	}
	exit := []string{"mpirun detected that one or more processes exited with non-zero status, thus causing",
		"  Process name: [[4242,1],1]", "  Exit code:    2"}
	f := watch(append([]string{"[1,0]<stderr>:fatal error: not this one", "[1,1]<stderr>:panic: boom", "[1,1]<stderr>:",
		"[1,1]<stderr>:goroutine 1 [running]:", "[1,1]<stderr>:main.main()"}, exit...)...)
	assert.Equal(t, Failure{Rank: 1, ExitCode: 2, Crash: "panic: boom"}, f)
	assert.False(t, f.isUsageError())
	assert.Equal(t, "rank 1 crashed (panic: boom) and exited with code 2", f.String())

	f = watch(append([]string{"[1,1]<stderr>:fatal error: -k must be at least 1", "[1,1]<stderr>:usage: train [flags]"}, exit...)...)
	assert.Empty(t, f.Crash)
	assert.True(t, f.isUsageError())

	// Untagged output (another MPI, or Run without WithTaggedOutput).
	f = watch(append([]string{"SIGSEGV: segmentation violation", "PC=0x1 m=0 sigcode=1", "", "goroutine 1 gp=0x1 m=0 [syscall]:"}, exit...)...)
	assert.Equal(t, "SIGSEGV: segmentation violation", f.Crash)
}

// TestLineWriterJoinsTaggedPieces: the pieces mpirun tagged one by one make the line the process wrote,
// also when another process's line comes between; a line of one tag, or of none, is left as it is.
func TestLineWriterJoinsTaggedPieces(t *testing.T) {
	var got []string
	w := &lineWriter{emit: func(l string) { got = append(got, l) }}
	_, err := w.Write([]byte(strings.Join([]string{
		"[1,1]<stderr>:panic: [1,1]<stderr>:runtime error: invalid memory address[1,1]<stderr>: [recovered][1,1]<stderr>:",
		"[1,1]<stderr>:goroutine [1,0]<stdout>:epoch 1",
		"[1,1]<stderr>:5[1,1]<stderr>: [running]:",
		"[1,0]<stdout>:epoch 2",
		"mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 11 (Segmentation fault).",
		"[1,1]<stderr>:[vm:19769] [1,1]<stderr>:[ 0] [1,1]<stderr>:/lib/libc.so.6(+0x3c050)[0x7f300b0e8050]",
	}, "\n") + "\n"))
	require.NoError(t, err)
	assert.Equal(t, []string{
		"[1,1]<stderr>:panic: runtime error: invalid memory address [recovered]",
		"[1,0]<stdout>:epoch 1",
		"[1,1]<stderr>:goroutine 5 [running]:",
		"[1,0]<stdout>:epoch 2",
		"mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 11 (Segmentation fault).",
		"[1,1]<stderr>:[vm:19769] [ 0] /lib/libc.so.6(+0x3c050)[0x7f300b0e8050]",
	}, got)
}
