// Package kernels is goaccel's set of CPU kernels for GoMLX's pure-Go backend: matrix products on BLAS or
// register tiles, convolutions and pooling, fused element-wise chains, row gathers and scatters, and
// gradients of products and convolutions built as products. Importing it registers the set with package
// cpu (package accel imports it):
//
//	import _ "github.com/goaccel/goaccel/cpu/kernels"
//
// The set installs only on the GoMLX release it was written against (SupportedGoMLX); on any other it
// registers itself inert, and the backend runs GoMLX's own kernels.
package kernels

import (
	"fmt"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/graph"

	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/cpu/internal/blas"
	"github.com/goaccel/goaccel/cpu/internal/convgraph"
	"github.com/goaccel/goaccel/cpu/internal/convkernel"
	"github.com/goaccel/goaccel/cpu/internal/elementwise"
	"github.com/goaccel/goaccel/cpu/internal/extraops"
	"github.com/goaccel/goaccel/cpu/internal/fusion"
	"github.com/goaccel/goaccel/cpu/internal/gemmgrad"
	"github.com/goaccel/goaccel/cpu/internal/indexing"
	"github.com/goaccel/goaccel/cpu/internal/ready"
	"github.com/goaccel/goaccel/cpu/internal/threads"
	"github.com/goaccel/goaccel/internal/vec32"
)

func init() { cpu.Register(newExtension()) }

// newExtension is the kernel set for this binary: installed, or inert with the reason.
func newExtension() cpu.Extension {
	if why := unsupported(); why != "" {
		return inert{why: why}
	}
	return installed{}
}

// convolutionForm reads Config.Convolutions (cpu.New validated it).
func convolutionForm(cfg cpu.Config) convgraph.Form {
	if cfg.Convolutions == "graph" {
		return convgraph.AsSlices
	}
	return convgraph.AsConvolutions
}

// installed is the kernel set in use.
type installed struct{}

// Wrap gives the backend the operations the kernels add or replace at graph-building time.
func (installed) Wrap(cfg cpu.Config, backend backends.Backend) (backends.Backend, error) {
	// The pure-Go backend's convolution and pooling are per-element loops, and it lacks the op of max
	// pooling's gradient. Either convkernel's executors replace them (Extend adds the missing op; the
	// executors are installed with the other kernels), or, for comparisons, the graph lowering builds them
	// from slices and dots.
	if convolutionForm(cfg) == convgraph.AsSlices {
		backend = convgraph.LowerConvolutions(backend)
	} else {
		backend = convkernel.Extend(backend)
	}
	// The ops the pure-Go backend lacks (Pad, Reverse, dynamic slices, batch normalization), grouped
	// convolutions as one per group, and pooling of booleans.
	backend = extraops.Extend(backend)
	// So that it sees every binary operation the graph builds: a broadcast single value (ReLU's zeros, an
	// optimizer's scalars) or a broadcast that only inserts axes (biases, LayerNorm's statistics) is passed
	// as it is, and never materialised.
	backend = elementwise.Extend(backend)
	// Inside fusion, so that it orders the graph as fusion leaves it: a step's marked buckets of gradients
	// (cpu.MarkReady) run as early as the backward pass allows.
	backend = ready.Extend(backend)
	// Outermost: its Compile sees the whole graph, after every other wrapper built its nodes, and runs each
	// chain of element-wise operations as one node.
	return fusion.Extend(backend), nil
}

// Apply installs the executors and gradient rules that cfg selects.
func (installed) Apply(cfg cpu.Config) error {
	form := convolutionForm(cfg)
	// extraops' gradient of grouped convolutions wraps the ConvGeneral rule chosen below: off while that rule
	// changes, and left alone otherwise (Apply also runs for a new thread budget alone, while graphs of other
	// ranks read the rules without a lock).
	if convgraph.Registered() != (cfg.Gradients != "gomlx") {
		extraops.UnregisterGradients()
	}
	switch cfg.Gradients {
	case "", "gemm":
		gemmgrad.Register()
		convgraph.Register()
		convgraph.SetForm(form)
		elementwise.RegisterGradients()
	case "gomlx":
		gemmgrad.Unregister()
		convgraph.Unregister()
		elementwise.UnregisterGradients()
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
	// The ops the pure-Go backend lacks, and the gradients GoMLX lacks for them: always on.
	if err := extraops.Install(); err != nil {
		return fmt.Errorf("compute: %w", err)
	}
	extraops.RegisterGradients()
	// Marked values (a step's buckets of gradients, whose sync starts inside the step): always on.
	if err := ready.Install(); err != nil {
		return fmt.Errorf("compute: %w", err)
	}
	budget := cfg.ThreadBudget()
	threads.Set(budget)
	switch cfg.Matmul {
	case "", "blas":
		if !blas.Built && cfg.Matmul == "blas" {
			return fmt.Errorf("compute: %s=blas but this binary was built without BLAS: rebuild with "+
				"`-tags blas` (needs libopenblas-dev)", cpu.MatmulEnvVar)
		}
		if err := blas.Install(budget); err != nil {
			return fmt.Errorf("compute: %w", err)
		}
	case "go":
		blas.Uninstall()
	}
	return nil
}

// MarkReady implements cpu.ReadyMarker.
func (installed) MarkReady(x, loss *graph.Node, index int, fn func(flat any, loss float64)) (*graph.Node, bool) {
	return ready.MarkReady(x, loss, index, fn)
}

// Describe reports the kernels installed now.
func (installed) Describe() cpu.Kernels {
	k := cpu.ShippedKernels("")
	if gemmgrad.Registered() {
		k.Gradients = "gemm"
	}
	k.Threads = threads.Budget()
	if blas.Installed() {
		k.Matmul = blas.Path()
	}
	switch {
	case convkernel.Installed():
		k.Convolutions = "goaccel's executors: a micro-kernel reading the padded input directly where it can (float32, AVX2, up to 2 spatial axes), else im2col + gemm"
	case convgraph.CurrentForm() == convgraph.AsSlices:
		k.Convolutions = "lowered to slices and dots in the graph"
	}
	loops := "Go loops (no AVX2 on this processor)"
	if vec32.Accelerated() {
		loops = "AVX2 loops"
	}
	switch {
	case fusion.Installed():
		k.Elementwise = "chains of operations fused into single passes, " + loops
	case elementwise.Installed():
		k.Elementwise = "one operation at a time, " + loops
	}
	if indexing.Installed() {
		k.Indexing = "gathers and scatter-adds of whole rows (embeddings, picked labels) row by row; others element by element"
	}
	return k
}

// inert is the kernel set on a GoMLX it was not written for: it touches nothing of GoMLX's, and takes back
// whatever an earlier registration installed.
type inert struct{ why string }

func (inert) Wrap(_ cpu.Config, backend backends.Backend) (backends.Backend, error) {
	return backend, nil
}

func (inert) Apply(cpu.Config) error {
	extraops.UnregisterGradients() // over convgraph's
	extraops.Uninstall()
	ready.Uninstall()
	fusion.Uninstall() // installed last, over elementwise's executors
	indexing.Uninstall()
	elementwise.Uninstall()
	convkernel.Uninstall()
	blas.Uninstall()
	gemmgrad.Unregister()
	convgraph.Unregister()
	elementwise.UnregisterGradients()
	return nil
}

func (e inert) Describe() cpu.Kernels { return cpu.ShippedKernels(e.why) }

// ScratchBytes asks the convolution executors what they take from their scratch pool for each ConvGeneral
// of g (nothing when they are not installed, or for a node whose parameters cannot be read).
func (installed) ScratchBytes(g *graph.Graph) int64 {
	if !convkernel.Installed() {
		return 0
	}
	var buffers []int64
	for _, node := range g.Nodes() {
		if node.Type() != graph.NodeTypeConvGeneral || len(node.Inputs()) != 2 {
			continue
		}
		p, err := convgraph.ReadConvParams(node)
		if err != nil {
			continue
		}
		buffers = append(buffers, convkernel.ScratchBuffers(convkernel.Conv{Input: node.Inputs()[0].Shape(),
			Kernel: node.Inputs()[1].Shape(), Output: node.Shape(), Axes: p.Axes, Strides: p.Strides,
			Paddings: p.Paddings, InputDilations: p.InputDilations, KernelDilations: p.KernelDilations,
			ChannelGroupCount: p.ChannelGroupCount, BatchGroupCount: p.BatchGroupCount})...)
	}
	return convkernel.PooledBytes(buffers)
}
