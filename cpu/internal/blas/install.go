package blas

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

var (
	// installMu serializes Install and Uninstall.
	installMu sync.Mutex
	// dotGeneralPatch puts execDotGeneral in simplego's executor table.
	dotGeneralPatch = gomlxpatch.ExecutorPatch{OpType: backends.OpTypeDotGeneral, Executor: execDotGeneral}
	// selfTested is set once selfTest passed: what it checks cannot change within a process.
	selfTested bool
)

// Install makes simplego run DotGeneral (and so graph.Dot and dense layers) on this package's gemm kernel,
// for every simplego backend in the process. It is idempotent; calling it again only changes the thread
// count. threads > 0 sets how many goroutines a large product is split over, each part a single-threaded
// OpenBLAS call (OpenBLAS never runs threads of its own); threads <= 0 leaves the current setting (at
// first OPENBLAS_NUM_THREADS when the library loaded, else all cores). Torch-style thread settings do not
// reach it, so the caller picks the count: a rank's threads times the ranks on a node should stay within
// its cores. The pure-Go kernel ignores threads: it parallelizes over GOMAXPROCS.
//
// Call it before executing graphs, not concurrently with executions: simplego reads its executor table
// without synchronization. Install runs a small DotGeneral to check that the patched internals behave as
// expected, and returns an error (leaving simplego untouched) if the GoMLX internals it relies on changed.
func Install(threads int) error {
	installMu.Lock()
	defer installMu.Unlock()
	if threads > 0 && threads != kernelThreads() {
		setKernelThreads(threads)
	}
	if dotGeneralPatch.Installed() {
		return nil
	}
	replaced, err := dotGeneralPatch.Install()
	if err != nil {
		return fmt.Errorf("blas: %w", err)
	}
	if replaced == nil {
		dotGeneralPatch.Uninstall()
		return errors.New("blas: simplego's executor table has no DotGeneral executor (GoMLX internals " +
			"changed; written against GoMLX v0.26.0)")
	}
	originalExecutor = replaced
	if !selfTested {
		if err := selfTest(); err != nil {
			dotGeneralPatch.Uninstall()
			return err
		}
		selfTested = true
	}
	return nil
}

// Uninstall puts simplego's original DotGeneral executor back, e.g. to compare both kernels in one process.
// Like Install, it must not run concurrently with executions.
func Uninstall() {
	installMu.Lock()
	defer installMu.Unlock()
	dotGeneralPatch.Uninstall()
}

// Installed reports whether simplego currently routes DotGeneral to this package's kernel.
func Installed() bool { return dotGeneralPatch.Installed() }

// Path describes, for logs and benchmark reports, which kernel simplego's DotGeneral runs on now, e.g.
// "OpenBLAS 0.3.21 Haswell (cblas_sgemm/dgemm), 2 threads", "OpenBLAS 0.3.21 Haswell (cblas_dgemm; float32
// on the AVX-512 micro-kernel), 1 thread", "pure Go (AVX2/FMA micro-kernel; gonum for float64)",
// "pure Go (gonum)" or "pure Go (simplego)".
func Path() string {
	if !Installed() {
		return "pure Go (simplego)"
	}
	return kernelDescription()
}

// Threads returns the number of threads the kernel uses: OpenBLAS's setting with the blas build tag,
// GOMAXPROCS for the pure-Go kernel.
func Threads() int {
	return kernelThreads()
}

// selfTest executes one small DotGeneral on a fresh simplego backend and checks both the result and that it
// went through execDotGeneral's gemm path (it shows in Calls), so that a broken patch fails Install instead of silently leaving
// simplego's kernel in place or computing garbage.
func selfTest() error {
	backend, err := simplego.New("")
	if err != nil {
		return fmt.Errorf("blas: self-test: %w", err)
	}
	defer backend.Finalize()

	// [2,3] x [3,2] with the lhs stored transposed ([3,2], contracting axis 0) to exercise a transpose flag.
	lhsT := []float32{1, 4, 2, 5, 3, 6}
	rhs := []float32{7, 8, 9, 10, 11, 12}
	want := []float32{58, 64, 139, 154}
	builder := backend.Builder("blas_self_test")
	lhsOp, err := builder.Parameter("lhs", shapes.Make(dtypes.Float32, 3, 2), nil)
	if err != nil {
		return fmt.Errorf("blas: self-test: %w", err)
	}
	rhsOp, err := builder.Parameter("rhs", shapes.Make(dtypes.Float32, 3, 2), nil)
	if err != nil {
		return fmt.Errorf("blas: self-test: %w", err)
	}
	productOp, err := builder.DotGeneral(lhsOp, []int{0}, nil, rhsOp, []int{0}, nil)
	if err != nil {
		return fmt.Errorf("blas: self-test: %w", err)
	}
	executable, err := builder.Compile([]backends.Op{productOp}, nil)
	if err != nil {
		return fmt.Errorf("blas: self-test: %w", err)
	}
	defer executable.Finalize()
	lhsBuffer, err := backend.BufferFromFlatData(0, lhsT, shapes.Make(dtypes.Float32, 3, 2))
	if err != nil {
		return fmt.Errorf("blas: self-test: %w", err)
	}
	rhsBuffer, err := backend.BufferFromFlatData(0, rhs, shapes.Make(dtypes.Float32, 3, 2))
	if err != nil {
		return fmt.Errorf("blas: self-test: %w", err)
	}

	before := Calls()
	outputs, err := executable.Execute([]backends.Buffer{lhsBuffer, rhsBuffer}, nil, 0)
	if err != nil {
		return fmt.Errorf("blas: self-test: %w", err)
	}
	got := make([]float32, len(want))
	if err := backend.BufferToFlatData(outputs[0], got); err != nil {
		return fmt.Errorf("blas: self-test: %w", err)
	}
	after := Calls()
	if layoutErr := dotGeneralMirror.Err(); layoutErr != nil {
		return fmt.Errorf("blas: %w", layoutErr)
	}
	if after.Direct+after.Copied == before.Direct+before.Copied {
		return errors.New("blas: self-test: the DotGeneral did not reach the gemm kernel after patching " +
			"simplego's executor table (GoMLX internals changed; written against GoMLX v0.26.0)")
	}
	for i := range want {
		if got[i] != want[i] {
			return fmt.Errorf("blas: self-test: [2,3]x[3,2] product is %v, want %v", got, want)
		}
	}
	return nil
}
