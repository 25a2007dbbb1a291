package cpu

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/graph"
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
	// ConvEnvVar: "kernel" (default) runs the pure-Go backend's convolutions and poolings on goaccel's
	// executors and builds convolution gradients as convolutions; "graph" lowers them into slices and dots
	// in the graph, as earlier versions did.
	ConvEnvVar = "GOACCEL_CONV"
)

// validate refuses settings no kernel set understands, whichever is registered, so that a typo in an
// environment variable is an error even where the kernels are inert.
func (cfg Config) validate() error {
	if g := cfg.Gradients; g != "" && g != "gemm" && g != "gomlx" {
		return fmt.Errorf("compute: %s=%q: want gemm or gomlx", GradientsEnvVar, g)
	}
	if m := cfg.Matmul; m != "" && m != "blas" && m != "go" {
		return fmt.Errorf("compute: %s=%q: want blas or go", MatmulEnvVar, m)
	}
	if c := cfg.Convolutions; c != "" && c != "kernel" && c != "graph" {
		return fmt.Errorf("compute: %s=%q: want kernel or graph", ConvEnvVar, c)
	}
	return nil
}

// ThreadBudget is the compute threads of one rank: its share of the node's cores, so that threads × ranks
// on the node never exceed the cores (OpenBLAS spins its threads, and oversubscribed spinning collapses).
func (cfg Config) ThreadBudget() int {
	if cfg.Threads > 0 {
		return cfg.Threads
	}
	return max(1, runtime.NumCPU()/max(1, cfg.LocalSize))
}

// Kernels says how this process computes: which gradients, which matrix multiplication, how many threads.
type Kernels struct {
	// Gradients is "gemm" or "gomlx" (see GradientsEnvVar).
	Gradients string
	// Matmul describes the pure-Go backend's matrix multiplication, e.g. "OpenBLAS 0.3.21, 2 threads".
	Matmul string
	// Threads is the compute threads this process splits an operation over, BLAS's products included (0
	// when goaccel's kernels are not installed).
	Threads int
	// Ops says how the pure-Go backend schedules a graph's operations: "sequential" or "parallel" (its own
	// default: independent operations on parallel goroutines when one graph executes alone), followed by
	// " (measured)" once a prepared model's first micro-batches chose it (SetSequentialOps).
	Ops string
	// Convolutions describes how the pure-Go backend convolves and pools (see ConvEnvVar).
	Convolutions string
	// Elementwise describes how the pure-Go backend runs element-wise operations: chains fused into single
	// passes, and whether its loops are AVX2 assembly or Go.
	Elementwise string
	// Indexing describes how the pure-Go backend runs Gather and ScatterSum: whole rows at a time, or
	// element by element.
	Indexing string
	// Inert is empty when goaccel's kernels are in use, else why GoMLX's own kernels run instead: no kernel
	// set was linked into the binary, or the GoMLX in it is not the version the kernels were written for.
	Inert string
}

// Extension is a set of kernels for the pure-Go backend, registered by package cpu/kernels. Its methods
// are called with this package's lock held, never concurrently.
type Extension interface {
	// Wrap returns a backend just created by GoMLX with the extension's operations added (each backend is
	// wrapped once, when New first creates it).
	Wrap(cfg Config, backend backends.Backend) (backends.Backend, error)
	// Apply sets the process-wide kernels (executor tables, gradient rules, BLAS threads) for cfg. New calls
	// it when a configuration differs from the one applied last, never while the settings are unchanged,
	// so that ranks sharing the process do not rewrite tables another rank's graph is reading. Even then it
	// must rewrite only what a changed setting decides: with only the thread budget changed, it changes the
	// budget and leaves executor tables and gradient rules as they are (graphs of other ranks read them
	// without synchronisation; cpu/kernels' TestNewWhileAnotherRankExecutes checks this under -race).
	Apply(cfg Config) error
	// Describe reports the kernels in use (Ops is filled in by CurrentKernels).
	Describe() Kernels
}

var (
	extensionMu sync.Mutex
	extension   Extension
	// appliedSettings is the kernel part of the Config the extension applied last, and applied whether it
	// was; ops is Kernels.Ops of the pure-Go backend New set up last.
	appliedSettings Config
	applied         bool
	opsSchedule     = "parallel"
	// opsMeasurable is whether the schedule of the pure-Go backend New set up last was left to the backend
	// (a bare "go" on more than one thread), so that a measurement may choose it (SetSequentialOps).
	opsMeasurable bool
)

// Register makes ext the pure-Go backend's kernel set: the last registration wins (package cpu/kernels
// registers once, at initialisation). A registration after a backend was made takes effect at the next New.
func Register(ext Extension) {
	extensionMu.Lock()
	defer extensionMu.Unlock()
	extension, applied = ext, false
}

// wrapPureGo gives a pure-Go backend the registered extension's operations.
func wrapPureGo(cfg Config, backend backends.Backend) (backends.Backend, error) {
	extensionMu.Lock()
	defer extensionMu.Unlock()
	if extension == nil {
		return backend, nil
	}
	return extension.Wrap(cfg, backend)
}

// kernelSettings keeps the fields of cfg that decide the process-wide kernels.
func kernelSettings(cfg Config) Config {
	return Config{Gradients: cfg.Gradients, Matmul: cfg.Matmul, Convolutions: cfg.Convolutions,
		Threads: cfg.ThreadBudget()}
}

// applyKernels applies the registered extension's kernels for a backend New returns, and records how the
// pure-Go backend schedules operations. Other backends keep GoMLX's own gradients: graph.VJPRegistration is
// process-wide, so a process that uses the pure-Go backend registers them for every graph it builds
// afterwards. A GoMLX whose internals changed makes the patches panic or fail their checks: either is
// returned as an error.
func applyKernels(cfg Config, backendName string) (err error) {
	if backendName != PureGo {
		return nil
	}
	extensionMu.Lock()
	defer extensionMu.Unlock()
	if extension != nil && (!applied || appliedSettings != kernelSettings(cfg)) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("compute: setting up the pure-Go backend's kernels: %v", r)
			}
		}()
		if err := extension.Apply(cfg); err != nil {
			return err
		}
		appliedSettings, applied = kernelSettings(cfg), true
	}
	return nil
}

// setOpsSchedule records the op scheduling that the pure-Go backend's configuration options select, and
// whether it was left to the backend (no options).
func setOpsSchedule(options string) {
	extensionMu.Lock()
	defer extensionMu.Unlock()
	opsSchedule = "parallel"
	if slices.Contains(strings.Split(options, ","), sequentialOps) {
		opsSchedule = "sequential"
	}
	opsMeasurable = options == ""
}

// OpsMeasurable reports whether the pure-Go backend New set up last schedules a graph's operations as the
// backend chooses (in parallel, on more than one thread, with no option given in GOMLX_BACKEND), so that a
// measurement of the program's own steps may choose between that and one operation after another
// (SetSequentialOps). The prepared model measures its first micro-batches both ways.
func OpsMeasurable() bool {
	extensionMu.Lock()
	defer extensionMu.Unlock()
	return opsMeasurable
}

// SetSequentialOps makes backend (GoMLX's pure-Go backend, wrapped by goaccel's kernels or not) run every
// graph's operations one after another, or in parallel as the backend chooses when sequential is false;
// measured says the choice came from timing the program's steps, for CurrentKernels' Ops. Results are the
// same either way: each operation computes the same values, only their order in time changes. It must not
// run while the backend executes a graph.
func SetSequentialOps(backend backends.Backend, sequential, measured bool) error {
	b, err := simplegoBackend(backend)
	if err != nil {
		return err
	}
	if err := gomlxpatch.SetSequentialOps(b, sequential); err != nil {
		return fmt.Errorf("compute: %w", err)
	}
	extensionMu.Lock()
	defer extensionMu.Unlock()
	opsSchedule = "parallel"
	if sequential {
		opsSchedule = "sequential"
	}
	if measured {
		opsSchedule += " (measured)"
	}
	return nil
}

// simplegoBackend finds GoMLX's pure-Go backend under goaccel's wrappers.
func simplegoBackend(backend backends.Backend) (*simplego.Backend, error) {
	if b, ok := gomlxpatch.Unwrap[*simplego.Backend](backend, "Backend"); ok {
		return b, nil
	}
	return nil, fmt.Errorf("compute: backend %T is not the pure-Go backend, nor a wrapper of it", backend)
}

// ScratchEstimator is implemented by an Extension whose kernels take memory of their own, beyond the
// values of a graph, to run it (convolutions' patches and padded copies).
type ScratchEstimator interface {
	// ScratchBytes is the most memory the kernels hold while running g's nodes, and keep afterwards.
	ScratchBytes(g *graph.Graph) int64
}

// ScratchBytes is what the registered kernels take, beyond g's values, to run g: what a memory estimate
// adds to the graph's own peak. 0 without kernels, or for kernels that take nothing of their own.
func ScratchBytes(g *graph.Graph) int64 {
	extensionMu.Lock()
	defer extensionMu.Unlock()
	if e, ok := extension.(ScratchEstimator); ok {
		return e.ScratchBytes(g)
	}
	return 0
}

// ShippedKernels describes GoMLX's pure-Go backend as shipped, with why goaccel's kernels are not in use
// (Kernels.Inert): what an extension that found the wrong GoMLX reports.
func ShippedKernels(inert string) Kernels {
	return Kernels{Gradients: "gomlx", Matmul: "pure Go (GoMLX's simplego kernel)",
		Convolutions: "simplego's own loops", Elementwise: "one operation at a time (GoMLX's loops)",
		Indexing: "element by element (GoMLX's loops)", Inert: inert}
}

// CurrentKernels reports the kernels in use in this process.
func CurrentKernels() Kernels {
	extensionMu.Lock()
	defer extensionMu.Unlock()
	k := ShippedKernels("no kernel set is linked into this binary (import github.com/goaccel/goaccel/cpu/kernels)")
	if extension != nil {
		k = extension.Describe()
	}
	k.Ops = opsSchedule
	return k
}
