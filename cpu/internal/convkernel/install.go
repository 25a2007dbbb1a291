package convkernel

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gomlx/gomlx/backends"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// Counts says how many operations each path computed since the process started; tests use it to check
// that the kernels really ran.
type Counts struct {
	// Convolutions ran as im2col + gemm, or directly (see DirectConvolutions).
	Convolutions uint64
	// DirectConvolutions are the Convolutions that ran on the float32 micro-kernel, reading the padded input
	// in place of im2col's patches.
	DirectConvolutions uint64
	// ConvolutionFallbacks ran on simplego's own ConvGeneral: channel or batch grouping, or a dtype other
	// than float32 and float64.
	ConvolutionFallbacks uint64
	// Pools are ReduceWindow operations run on this package's window walk.
	Pools uint64
	// Scatters are SelectAndScatter operations (gradients of max and min pooling).
	Scatters uint64
	// PoolFallbacks ran on simplego's own ReduceWindow: dilations, products, other dtypes.
	PoolFallbacks uint64
}

var convCalls, directConvCalls, convFallbacks, poolCalls, poolFallbacks, scatterCalls atomic.Uint64

// Calls returns the operations computed by each path so far.
func Calls() Counts {
	return Counts{Convolutions: convCalls.Load(), DirectConvolutions: directConvCalls.Load(),
		ConvolutionFallbacks: convFallbacks.Load(),
		Pools:                poolCalls.Load(), PoolFallbacks: poolFallbacks.Load(), Scatters: scatterCalls.Load()}
}

var (
	installMu sync.Mutex
	patches   = []*gomlxpatch.ExecutorPatch{
		{OpType: backends.OpTypeConvGeneral, Executor: execConvGeneral},
		{OpType: backends.OpTypeReduceWindow, Executor: execReduceWindow},
		{OpType: backends.OpTypeSelectAndScatterMax, Executor: execSelectAndScatter},
		{OpType: backends.OpTypeSelectAndScatterMin, Executor: execSelectAndScatter},
	}
	// selfTested is set once selfTest passed: what it checks cannot change within a process.
	selfTested bool
	// originals receives, per patch, the executor it replaced: the fallbacks.
	originals = []*gomlxpatch.Executor{&originalConvGeneral, &originalReduceWindow, nil, nil}
)

// Install makes every simplego backend of the process run ConvGeneral as im2col plus one gemm (the blas
// package's kernel: OpenBLAS with the blas build tag, gonum's without) and ReduceWindow as a walk over
// precomputed window offsets, and gives simplego executors for SelectAndScatterMax and SelectAndScatterMin
// (the gradients of max and min pooling), which Extend's builder creates. It is idempotent.
//
// Like blas.Install it rewrites simplego's executor table, so it must not run concurrently with
// executions; it fails, leaving simplego untouched, when the GoMLX internals it relies on changed.
func Install() error {
	installMu.Lock()
	defer installMu.Unlock()
	if Installed() {
		return nil
	}
	for i, patch := range patches {
		replaced, err := patch.Install()
		if err == nil && originals[i] != nil {
			if replaced == nil {
				err = fmt.Errorf("simplego has no %s executor to fall back on", patch.OpType)
			}
			*originals[i] = replaced
		}
		if err != nil {
			uninstallLocked()
			return fmt.Errorf("convkernel: %w", err)
		}
	}
	if selfTested {
		return nil
	}
	if err := selfTest(); err != nil {
		return err
	}
	selfTested = true
	return nil
}

// Uninstall puts simplego's own executors back (and removes the SelectAndScatter ones). Like Install, it
// must not run concurrently with executions.
func Uninstall() {
	installMu.Lock()
	defer installMu.Unlock()
	uninstallLocked()
}

func uninstallLocked() {
	for _, patch := range patches {
		patch.Uninstall()
	}
}

// Installed reports whether simplego runs convolutions on this package's kernel.
func Installed() bool { return patches[0].Installed() }

// errNotInstalled is what a SelectAndScatter node reports when executed without Install.
var errNotInstalled = errors.New("convkernel: SelectAndScatter needs convkernel.Install")

// scratchPool keeps the buffers that convolutions pack operands and patches into, so that each training
// step reuses the same memory instead of faulting in fresh pages: simplego's own buffer pool is a
// sync.Pool, emptied by every garbage collection (see docs/cpu.md).
type scratchPool[T float32 | float64] struct {
	mu   sync.Mutex
	free [][]T
	// gets, when set, is told the length of every get (tests compare it with ScratchBuffers).
	gets func(n int)
}

// maxPooledScratch bounds the buffers kept: concurrent convolutions each hold up to four.
const maxPooledScratch = 16

var (
	scratch32 scratchPool[float32]
	scratch64 scratchPool[float64]
)

// get returns a buffer of length n, with arbitrary contents: the smallest free one that fits, or a new one.
func (p *scratchPool[T]) get(n int) []T {
	p.mu.Lock()
	if p.gets != nil {
		p.gets(n)
	}
	best := -1
	for i, buf := range p.free {
		if cap(buf) >= n && (best < 0 || cap(buf) < cap(p.free[best])) {
			best = i
		}
	}
	if best >= 0 {
		buf := p.free[best]
		p.free = append(p.free[:best], p.free[best+1:]...)
		p.mu.Unlock()
		return buf[:n]
	}
	p.mu.Unlock()
	return make([]T, n)
}

// put returns a buffer; when the pool is full the smallest buffer is dropped.
func (p *scratchPool[T]) put(buf []T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free = append(p.free, buf)
	if len(p.free) > maxPooledScratch {
		smallest := 0
		for i, b := range p.free {
			if cap(b) < cap(p.free[smallest]) {
				smallest = i
			}
		}
		p.free = append(p.free[:smallest], p.free[smallest+1:]...)
	}
}
