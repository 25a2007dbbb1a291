package compute

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/goaccel/goaccel/backends/compute/blas"
	"github.com/goaccel/goaccel/backends/compute/convgraph"
	"github.com/goaccel/goaccel/backends/compute/convkernel"
	"github.com/goaccel/goaccel/backends/compute/elementwise"
	"github.com/goaccel/goaccel/backends/compute/fusion"
	"github.com/goaccel/goaccel/backends/compute/gemmgrad"
	"github.com/goaccel/goaccel/backends/compute/indexing"
	"github.com/goaccel/goaccel/backends/compute/internal/threads"
	"github.com/goaccel/goaccel/internal/vec32"
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
	// ConvEnvVar: "kernel" (default) runs the pure-Go backend's convolutions and poolings on convkernel's
	// executors (im2col + gemm, window walks, SelectAndScatter) and builds convolution gradients as
	// convolutions; "graph" lowers them into slices and dots in the graph, as earlier versions did.
	ConvEnvVar = "GOACCEL_CONV"
)

// convolutionForm reads Config.Convolutions.
func convolutionForm(cfg Config) (convgraph.Form, error) {
	switch c := cfg.Convolutions; c {
	case "", "kernel":
		return convgraph.AsConvolutions, nil
	case "graph":
		return convgraph.AsSlices, nil
	default:
		return 0, fmt.Errorf("compute: %s=%q: want kernel or graph", ConvEnvVar, c)
	}
}

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
	// Convolutions describes how the pure-Go backend convolves and pools (see ConvEnvVar).
	Convolutions string
	// Elementwise describes how the pure-Go backend runs element-wise operations: chains fused into single
	// passes (package fusion), and whether its loops are AVX2 assembly or Go.
	Elementwise string
	// Indexing describes how the pure-Go backend runs Gather and ScatterSum (package indexing): whole rows
	// at a time, or element by element.
	Indexing string
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
	k.Convolutions = "simplego's own loops"
	switch {
	case convkernel.Installed():
		k.Convolutions = "im2col + gemm executors"
	case convgraph.CurrentForm() == convgraph.AsSlices:
		k.Convolutions = "lowered to slices and dots in the graph"
	}
	loops := "Go loops (no AVX2 on this processor)"
	if vec32.Accelerated() {
		loops = "AVX2 loops"
	}
	k.Elementwise = "one operation at a time (GoMLX's loops)"
	switch {
	case fusion.Installed():
		k.Elementwise = "chains of operations fused into single passes, " + loops
	case elementwise.Installed():
		k.Elementwise = "one operation at a time, " + loops
	}
	k.Indexing = "element by element (GoMLX's loops)"
	if indexing.Installed() {
		k.Indexing = "gathers and scatter-adds of whole rows (embeddings, picked labels) row by row; others element by element"
	}
	opsMu.Lock()
	k.Ops = opsSchedule
	opsMu.Unlock()
	return k
}

// setUpKernels applies goaccel's compute paths for a backend it just created. They exist for the pure-Go
// backend, so other backends keep GoMLX's own gradients (graph.VJPRegistration is process-wide: a process
// that uses the pure-Go backend registers them for every graph it builds afterwards). A GoMLX whose
// internals changed makes the patches panic or fail their checks: either is returned as an error.
func setUpKernels(cfg Config, backendName string) (err error) {
	if backendName != PureGo {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("compute: setting up the pure-Go backend's kernels: %v", r)
		}
	}()
	form, err := convolutionForm(cfg)
	if err != nil {
		return err
	}
	switch g := cfg.Gradients; g {
	case "", "gemm":
		gemmgrad.Register()
		convgraph.Register()
		convgraph.SetForm(form)
		elementwise.RegisterGradients()
	case "gomlx":
		gemmgrad.Unregister()
		convgraph.Unregister()
		elementwise.UnregisterGradients()
	default:
		return fmt.Errorf("compute: %s=%q: want gemm or gomlx", GradientsEnvVar, g)
	}
	// Element-wise broadcasts and Sign give simplego's own results, only faster: always on. Fusion computes
	// the same operations as those executors, chain by chain: on too, installed after them so that its
	// executors fall back on theirs for the nodes it did not fuse.
	if err := elementwise.Install(); err != nil {
		return fmt.Errorf("compute: %w", err)
	}
	// Row gathers and scatters give simplego's own results (sums in the same order): always on.
	if err := indexing.Install(); err != nil {
		return fmt.Errorf("compute: %w", err)
	}
	if err := fusion.Install(); err != nil {
		return fmt.Errorf("compute: %w", err)
	}
	if form == convgraph.AsConvolutions {
		if err := convkernel.Install(); err != nil {
			return fmt.Errorf("compute: %w", err)
		}
	} else {
		convkernel.Uninstall()
	}
	budget, err := threadBudget(cfg)
	if err != nil {
		return err
	}
	threads.Set(budget)
	switch m := cfg.Matmul; m {
	case "", "blas":
		if !blas.Built && m == "blas" {
			return fmt.Errorf("compute: %s=blas but this binary was built without BLAS: rebuild with "+
				"`-tags blas` (needs libopenblas-dev)", MatmulEnvVar)
		}
		if err := blas.Install(budget); err != nil {
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
