package compute

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/goaccel/goaccel/backends/compute/blas"
	"github.com/goaccel/goaccel/backends/compute/convgrad"
	"github.com/goaccel/goaccel/backends/compute/gemmgrad"
)

// Environment variables that choose how the pure-Go backend computes. Both exist for comparisons (the
// benchmarks measure GoMLX as shipped against goaccel's paths in one run) and for ruling goaccel's kernels
// out when chasing a numerical difference; the defaults are the fast paths.
const (
	// GradientsEnvVar: "gemm" (default) builds Dot/DotGeneral gradients as matrix multiplications and gives
	// convolutions and pooling gradients the pure-Go backend can run; "gomlx" keeps GoMLX's own.
	GradientsEnvVar = "GOACCEL_GRADIENTS"
	// MatmulEnvVar: "blas" (default when built with the blas tag) runs the pure-Go backend's matrix
	// multiplications on OpenBLAS; "go" keeps the backend's own kernel.
	MatmulEnvVar = "GOACCEL_MATMUL"
	// ThreadsEnvVar sets the compute threads of this process (BLAS threads; with 1, sequential operations
	// on the pure-Go backend); by default the node's cores divided by the processes on it, so that ranks
	// sharing a node do not oversubscribe its cores.
	ThreadsEnvVar = "GOACCEL_BLAS_THREADS"
)

// Kernels says how this process computes: which gradients, which matrix multiplication, how many threads.
type Kernels struct {
	// Gradients is "gemm" or "gomlx" (see GradientsEnvVar).
	Gradients string
	// Matmul describes the pure-Go backend's matrix multiplication, e.g. "OpenBLAS 0.3.21, 2 threads".
	Matmul string
	// Threads is the number of BLAS threads this process uses (0 when BLAS is not in use).
	Threads int
	// Ops says how the pure-Go backend schedules a graph's operations: "sequential" or "parallel" (its own
	// default: independent operations on parallel goroutines when one graph executes alone).
	Ops string
}

var (
	opsMu sync.Mutex
	// opsSchedule is Kernels.Ops of the pure-Go backend New set up last.
	opsSchedule = "parallel"
)

// setOpsSchedule records the op scheduling that the pure-Go backend's configuration options select.
func setOpsSchedule(options string) {
	opsMu.Lock()
	defer opsMu.Unlock()
	opsSchedule = "parallel"
	if slices.Contains(strings.Split(options, ","), sequentialOps) {
		opsSchedule = "sequential"
	}
}

// CurrentKernels reports the kernels in use in this process.
func CurrentKernels() Kernels {
	k := Kernels{Gradients: "gomlx", Matmul: "pure Go (GoMLX's simplego kernel)"}
	if gemmgrad.Registered() {
		k.Gradients = "gemm"
	}
	if blas.Installed() {
		k.Matmul, k.Threads = blas.Path(), blas.Threads()
	}
	opsMu.Lock()
	k.Ops = opsSchedule
	opsMu.Unlock()
	return k
}

// setUpKernels applies goaccel's compute paths for a backend it just created. Gradient rules are graph-level
// and help every backend (XLA fuses either form), so they are registered whatever the backend; the matmul
// kernel replaces the pure-Go backend's own and only matters there.
func setUpKernels(cfg Config, backendName string) error {
	switch g := cfg.Gradients; g {
	case "", "gemm":
		gemmgrad.Register()
		convgrad.Register()
	case "gomlx":
		gemmgrad.Unregister()
		convgrad.Unregister()
	default:
		return fmt.Errorf("compute: %s=%q: want gemm or gomlx", GradientsEnvVar, g)
	}
	if backendName != PureGo {
		return nil
	}
	switch m := cfg.Matmul; m {
	case "", "blas":
		if !blas.Built && m == "blas" {
			return fmt.Errorf("compute: %s=blas but this binary was built without BLAS: rebuild with "+
				"`-tags blas` (needs libopenblas-dev)", MatmulEnvVar)
		}
		threads, err := threadBudget(cfg)
		if err != nil {
			return err
		}
		if err := blas.Install(threads); err != nil {
			return fmt.Errorf("compute: %w", err)
		}
	case "go":
		blas.Uninstall()
	default:
		return fmt.Errorf("compute: %s=%q: want blas or go", MatmulEnvVar, m)
	}
	return nil
}

// threadBudget is the compute threads of one rank: its share of the node's cores, so that threads × ranks
// on the node never exceed the cores (OpenBLAS spins its threads, and oversubscribed spinning collapses).
func threadBudget(cfg Config) (int, error) {
	if cfg.Threads > 0 {
		return cfg.Threads, nil
	}
	return max(1, runtime.NumCPU()/max(1, cfg.LocalSize)), nil
}
