// Package fusion runs chains of element-wise float32 operations of GoMLX's pure-Go backend (simplego) as
// single operations. GoMLX builds every activation, normalisation and optimizer update from primitive
// operations — a GELU is six, an Adam update about fourteen, a ReLU's gradient three — and simplego runs
// each as a pass over whole tensors that are too large for the processor's caches, so a step's element-wise
// time is mostly memory traffic. Here, when a graph is compiled, each chain of element-wise operations
// whose intermediate results nothing else reads becomes one node that walks its inputs once, a tile of
// elements at a time, computing the whole chain on tiles that stay in the first-level cache, with the
// vectorised loops of vec32.
//
// Every element goes through the same float32 operations in the same order as without fusion (those of
// goaccel's element-wise executors), so results do not change. The rewriting happens in the builder's
// Compile, before simplego counts the uses of every node: the intermediate nodes of a fused chain are no
// longer reachable from the outputs, and simplego never runs them.
//
// Install must run once before backends made by Extend compile (cpu.New does both).
package fusion

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// Extend returns a backend that is inner (GoMLX's pure-Go backend, possibly already extended) whose
// builders fuse element-wise chains when they compile, while the executors are installed (see Install).
//
// Tensors are bound to the backend they were used with: use the returned backend throughout.
func Extend(inner backends.Backend) backends.Backend { return &fusingBackend{Backend: inner} }

// fusingBackend is a pointer type so that backends compare by identity.
type fusingBackend struct{ backends.Backend }

func (b *fusingBackend) Builder(name string) backends.Builder {
	return &fusingBuilder{Builder: b.Backend.Builder(name)}
}

type fusingBuilder struct{ backends.Builder }

// Compile fuses the graph's element-wise chains, then compiles it as inner does.
func (b *fusingBuilder) Compile(outputs []backends.Op, shardings []*backends.ShardingSpec) (backends.Executable, error) {
	if Installed() && len(shardings) == 0 {
		if nodes, ok := simplegoNodes(outputs); ok {
			fused, err := Fuse(nodes)
			if err != nil {
				return nil, fmt.Errorf("fusion: %w", err)
			}
			fusedChains.Add(uint64(fused.Chains))
			rowNodes.Add(uint64(fused.RowKernels))
			concatAddNodes.Add(uint64(fused.ConcatAdds))
			productNodes.Add(uint64(fused.Products))
			windows.Add(uint64(fused.Windows))
			fusedOps.Add(uint64(fused.Ops))
		}
	}
	return b.Builder.Compile(outputs, shardings)
}

func simplegoNodes(outputs []backends.Op) ([]*simplego.Node, bool) {
	nodes := make([]*simplego.Node, len(outputs))
	for i, op := range outputs {
		node, ok := op.(*simplego.Node)
		if !ok || node == nil {
			return nil, false
		}
		nodes[i] = node
	}
	return nodes, true
}

// fusedOpType is the op type of a fused node: the chain's root is rewritten into an Identity that holds
// a program, so that one executor (Identity's, which fusion alone patches) runs every fused node, whatever
// other goaccel packages install for the operations it replaces. An Identity without a program runs as
// simplego's.
const fusedOpType = backends.OpTypeIdentity

var (
	installMu sync.Mutex
	patch     = &gomlxpatch.ExecutorPatch{OpType: fusedOpType, Executor: execFused}
	// identity is the Identity executor the patch replaced: simplego's.
	identity gomlxpatch.Executor

	fusedChains, fusedOps, runs, rowNodes, rowRuns atomic.Uint64
	concatAddNodes, concatAddRuns, windows         atomic.Uint64
	productNodes, productRuns                      atomic.Uint64
)

func execFused(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	switch p := gomlxpatch.NodeData(node).(type) {
	case *program:
		runs.Add(1)
		return p.run(backend, inputs, inputsOwned)
	case *concatAddKernel:
		concatAddRuns.Add(1)
		return p.run(backend, inputs, inputsOwned)
	case *productKernel: // before rowKernel, whose methods it has
		productRuns.Add(1)
		return p.run(backend, inputs, inputsOwned)
	case rowKernel:
		rowRuns.Add(1)
		return p.run(backend, inputs, inputsOwned)
	}
	return identity(backend, node, inputs, inputsOwned)
}

// Install puts the executor of fused nodes in simplego's table, and turns fusion on for backends made by
// Extend. It is idempotent, and must not run concurrently with executions. Executables compiled while it
// is installed need it to stay installed: their fused nodes run only through its executor.
func Install() error {
	installMu.Lock()
	defer installMu.Unlock()
	if patch.Installed() {
		return nil // identity stays as it is: executors running now read it
	}
	replaced, err := patch.Install()
	if err == nil && replaced == nil {
		patch.Uninstall()
		err = fmt.Errorf("simplego has no %s executor to fall back on", fusedOpType)
	}
	if err != nil {
		return fmt.Errorf("fusion: %w", err)
	}
	identity = replaced
	return nil
}

// Uninstall restores simplego's executor; graphs compiled afterwards are not fused. Executables compiled
// while it was installed must not run afterwards.
func Uninstall() {
	installMu.Lock()
	defer installMu.Unlock()
	patch.Uninstall()
}

// Installed reports whether fusion is on.
func Installed() bool { return patch.Installed() }

// Counts says how much fusion did since the process started.
type Counts struct {
	Chains uint64 // fused nodes compiled
	Ops    uint64 // element-wise operations they replace
	Runs   uint64 // executions of fused nodes
	// RowKernels and RowRuns count the nodes rewritten into row kernels (softmaxes, their gradients, layer
	// norms) and their executions.
	RowKernels, RowRuns uint64
	// ConcatAdds and ConcatAddRuns count the additions of a concatenation rewritten to add each part in
	// place (the gradient accumulation into flat buckets) and their executions.
	ConcatAdds, ConcatAddRuns uint64
	// Windows counts fused programs' inputs read inside a larger vector instead of through a Slice's copy.
	Windows uint64
	// Products and ProductRuns count the matrix products rewritten to read or write through Transposes in
	// place, and their executions.
	Products, ProductRuns uint64
}

// Calls returns the counts so far.
func Calls() Counts {
	return Counts{Chains: fusedChains.Load(), Ops: fusedOps.Load(), Runs: runs.Load(), RowKernels: rowNodes.Load(),
		RowRuns: rowRuns.Load(), ConcatAdds: concatAddNodes.Load(), ConcatAddRuns: concatAddRuns.Load(),
		Windows: windows.Load(), Products: productNodes.Load(), ProductRuns: productRuns.Load()}
}
