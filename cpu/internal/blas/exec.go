package blas

import (
	"fmt"
	"sync/atomic"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// Counts says how many DotGenerals each path computed since the process started; tests use it to check the
// gemm kernel really ran.
type Counts struct {
	// Direct DotGenerals ran on the gemm kernel straight from the operands' memory.
	Direct uint64
	// Strided counts the Direct DotGenerals that read an operand with row strides and batch offsets
	// (batch axes between its rows and columns, as attention's heads) rather than packed.
	Strided uint64
	// Copied DotGenerals ran on the gemm kernel after one or both operands were copied into gemm order.
	Copied uint64
	// Through counts the products planned with PlanProduct that ran: DotGenerals that read an operand, or
	// wrote their result, through a Transpose without copying it.
	Through uint64
	// Fallback DotGenerals ran on simplego's own executor: a dtype other than float32/float64, or node data
	// that does not have the layout this package checked.
	Fallback uint64
}

var directCalls, stridedCalls, copiedCalls, fallbackCalls atomic.Uint64

// Calls returns the number of DotGenerals computed by each path so far.
func Calls() Counts {
	return Counts{Direct: directCalls.Load(), Strided: stridedCalls.Load(), Copied: copiedCalls.Load(),
		Through: throughCalls.Load(), Fallback: fallbackCalls.Load()}
}

// copyToGemmOrder lets DotGenerals whose layout no gemm transpose flag covers run on the kernel after a copy;
// tests turn it off to exercise the fallback with float operands.
var copyToGemmOrder = true

// originalExecutor is the DotGeneral executor found in simplego's table at Install: the fallback.
var originalExecutor gomlxpatch.Executor

// execDotGeneral is the executor Install puts in simplego's table for DotGeneral. Like simplego's, it returns
// the normalized [batch, lhsCross, rhsCross] product; simplego's graph reshapes it afterwards.
func execDotGeneral(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	output, handled, err := execGemm(backend, node, inputs)
	if handled {
		return output, err
	}
	fallbackCalls.Add(1)
	return originalExecutor(backend, node, inputs, inputsOwned)
}

// execGemm runs the DotGeneral on the gemm kernel; handled is false when it cannot (the caller falls back).
func execGemm(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer) (
	output *simplego.Buffer, handled bool, err error) {
	if len(inputs) != 2 {
		return nil, false, nil
	}
	params := dotGeneralParamsOf(node)
	if params == nil {
		return nil, false, nil
	}
	lhsShape, rhsShape, ok := readOperands(inputs, backend.BufferShape)
	if !ok {
		return nil, false, nil
	}
	dtype := lhsShape.DType
	if (dtype != dtypes.Float32 && dtype != dtypes.Float64) || rhsShape.DType != dtype {
		return nil, false, nil
	}
	plan, ok := planGemm(lhsShape.Dimensions, rhsShape.Dimensions, params, copyToGemmOrder)
	if !ok {
		return nil, false, nil
	}
	lhsFlat, rhsFlat, ok := readOperands(inputs, backend.BufferData)
	if !ok {
		return nil, false, nil
	}

	output = backend.NewBuffer(shapes.Make(dtype, params.batchSize, params.lhsCrossSize, params.rhsCrossSize))
	if output == nil {
		return nil, true, fmt.Errorf("blas: DotGeneral: backend is finalized")
	}
	outputFlat, err := backend.BufferData(output)
	if err == nil {
		switch dtype {
		case dtypes.Float32:
			err = runPlan(backend, plan, lhsShape, rhsShape, lhsFlat.([]float32), rhsFlat.([]float32),
				outputFlat.([]float32), sgemmBatched)
		case dtypes.Float64:
			err = runPlan(backend, plan, lhsShape, rhsShape, lhsFlat.([]float64), rhsFlat.([]float64),
				outputFlat.([]float64), dgemmBatched)
		}
	}
	if err != nil {
		_ = backend.BufferFinalize(output)
		return nil, true, err
	}
	if plan.lhsPermutation != nil || plan.rhsPermutation != nil {
		copiedCalls.Add(1)
	} else {
		directCalls.Add(1)
		if !plan.gemm.packed() {
			stridedCalls.Add(1)
		}
	}
	return output, true, nil
}

// readOperands reads both operands of a DotGeneral with read (their shapes, or their flat data); ok is false
// when either read fails.
func readOperands[T any](inputs []*simplego.Buffer, read func(backends.Buffer) (T, error)) (lhs, rhs T, ok bool) {
	lhs, lhsErr := read(inputs[0])
	rhs, rhsErr := read(inputs[1])
	return lhs, rhs, lhsErr == nil && rhsErr == nil
}

// runPlan copies the operands the plan says need it into scratch buffers from simplego's pool, then runs the
// batched gemm into output.
func runPlan[T float32 | float64](backend *simplego.Backend, plan gemmPlan, lhsShape, rhsShape shapes.Shape,
	lhs, rhs, output []T, gemm func(gemmShape, []T, []T, []T)) error {
	var err error
	if plan.lhsPermutation != nil {
		var release func()
		lhs, release, err = copyInGemmOrder(backend, lhsShape, lhs, plan.lhsPermutation)
		if err != nil {
			return err
		}
		defer release()
	}
	if plan.rhsPermutation != nil {
		var release func()
		rhs, release, err = copyInGemmOrder(backend, rhsShape, rhs, plan.rhsPermutation)
		if err != nil {
			return err
		}
		defer release()
	}
	gemm(plan.gemm, lhs, rhs, output)
	return nil
}

// copyInGemmOrder copies flat (of the given shape) with its axes permuted into a scratch buffer taken from
// simplego's buffer pool, so repeated steps reuse the same memory; release returns it to the pool.
func copyInGemmOrder[T float32 | float64](backend *simplego.Backend, shape shapes.Shape, flat []T,
	permutation []int) (copied []T, release func(), err error) {
	scratch := backend.NewBuffer(shapes.Make(shape.DType, len(flat)))
	if scratch == nil {
		return nil, nil, fmt.Errorf("blas: DotGeneral: backend is finalized")
	}
	scratchFlat, err := backend.BufferData(scratch)
	if err != nil {
		_ = backend.BufferFinalize(scratch)
		return nil, nil, err
	}
	copied = scratchFlat.([]T)
	transposeInto(copied, flat, shape.Dimensions, permutation)
	return copied, func() { _ = backend.BufferFinalize(scratch) }, nil
}
