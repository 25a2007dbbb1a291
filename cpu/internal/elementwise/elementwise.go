// Package elementwise speeds up element-wise operations of GoMLX's pure-Go backend (simplego) where its own
// executors are slow in ways every model pays for:
//
//   - Binary operations (Add, Sub, Mul, Div, Max, Min) whose operands broadcast a non-scalar tensor, such as
//     a bias [1, 1, 1, C] added to activations [N, H, W, C], or a per-example scale [N, 1] applied to
//     [N, D]: simplego walks those with a per-element index iterator. Here the broadcast operand repeats
//     as a block (a trailing pattern) or each of its elements spans a block (a leading one), in plain
//     loops. Same shapes and scalars stay with simplego, which already loops over them directly.
//   - Reductions (ReduceSum, ReduceMax, ReduceMin) over contiguous axes, and conversions from booleans,
//     which simplego routes through per-element iterators and dispatch.
//   - Transpose and BroadcastInDim, which move data: as block copies and fills.
//   - Exp and Erf in float32, computed in float32 (see unary.go for the approximations and their error
//     bounds) instead of through float64.
//   - Sign, which GoMLX uses for the gradients of Max, Min, Abs and ReLU: simplego's branches on every
//     element's sign mispredict on real data; here it is computed without branches.
//
// Install patches simplego's executor table (through the same internals as the blas and convkernel
// packages); what it does not handle falls back to simplego's own executors, with identical results.
package elementwise

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gomlx/gomlx/backends"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// binaryOps are the operations whose broadcasts Install speeds up.
var binaryOps = []backends.OpType{backends.OpTypeAdd, backends.OpTypeSub, backends.OpTypeMul,
	backends.OpTypeDiv, backends.OpTypeMax, backends.OpTypeMin}

var (
	installMu sync.Mutex
	patches   []*gomlxpatch.ExecutorPatch
	// fallbacks holds simplego's own executor per op type, found at Install.
	fallbacks [backends.OpTypeLast]gomlxpatch.Executor

	broadcastCalls, signCalls atomicCounter
)

// atomicCounter counts calls of one path.
type atomicCounter = atomic.Uint64

const (
	opTypeConvertDType   = backends.OpTypeConvertDType
	opTypeTranspose      = backends.OpTypeTranspose
	opTypeBroadcastInDim = backends.OpTypeBroadcastInDim
)

func init() {
	for _, opType := range binaryOps {
		patches = append(patches, &gomlxpatch.ExecutorPatch{OpType: opType, Executor: binaryExecutor(opType)})
	}
	for _, opType := range reduceOps {
		patches = append(patches, &gomlxpatch.ExecutorPatch{OpType: opType, Executor: reduceExecutor(opType)})
	}
	patches = append(patches, &gomlxpatch.ExecutorPatch{OpType: backends.OpTypeSign, Executor: execSign},
		&gomlxpatch.ExecutorPatch{OpType: backends.OpTypeConvertDType, Executor: execConvertDType},
		&gomlxpatch.ExecutorPatch{OpType: backends.OpTypeTranspose, Executor: execTranspose},
		&gomlxpatch.ExecutorPatch{OpType: backends.OpTypeBroadcastInDim, Executor: execBroadcastInDim},
		&gomlxpatch.ExecutorPatch{OpType: backends.OpTypeExp, Executor: execExp},
		&gomlxpatch.ExecutorPatch{OpType: backends.OpTypeErf, Executor: execErf})
}

// Counts says how many operations this package computed since the process started.
type Counts struct {
	Broadcasts      uint64 // binary operations with a non-scalar broadcast
	Signs           uint64
	Reductions      uint64 // ReduceSum, ReduceMax and ReduceMin over contiguous axes
	Conversions     uint64 // ConvertDType from booleans
	Transposes      uint64
	Exps, Erfs      uint64 // float32 Exp and Erf
	BroadcastInDims uint64
}

// Calls returns the operations computed so far.
func Calls() Counts {
	return Counts{Broadcasts: broadcastCalls.Load(), Signs: signCalls.Load(), Reductions: reduceCalls.Load(),
		Conversions: convertCalls.Load(), Transposes: transposeCalls.Load(), BroadcastInDims: broadcastInDimCalls.Load(),
		Exps: expCalls.Load(), Erfs: erfCalls.Load()}
}

// Install puts this package's executors in simplego's table, for every simplego backend of the process. It
// is idempotent, and must not run concurrently with executions.
func Install() error {
	installMu.Lock()
	defer installMu.Unlock()
	err := gomlxpatch.InstallReplacing(patches, func(opType backends.OpType, replaced gomlxpatch.Executor) {
		fallbacks[opType] = replaced
	})
	if err != nil {
		return fmt.Errorf("elementwise: %w", err)
	}
	return nil
}

// Uninstall restores simplego's own executors.
func Uninstall() {
	installMu.Lock()
	defer installMu.Unlock()
	gomlxpatch.UninstallAll(patches)
}

// Installed reports whether the executors are in simplego's table.
func Installed() bool { return patches[0].Installed() }
