package elementwise

import (
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/broadcast"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// broadcastPlan is a binary operation whose small operand spans a contiguous run of the large one's axes
// (see broadcast.Pattern): output[p, m, q] = large[p, m, q] ⊕ small[m].
type broadcastPlan struct {
	before, within, after int
	smallIsLHS            bool // the small operand is the left one (order matters for Sub and Div)
}

// planBroadcast recognises that pattern; ok is false for anything else (same shapes, scalars, broadcasts on
// both sides or with holes), which simplego handles.
func planBroadcast(lhs, rhs shapes.Shape) (plan broadcastPlan, ok bool) {
	if lhs.Rank() != rhs.Rank() || lhs.Rank() == 0 || lhs.Equal(rhs) || lhs.Size() == 1 || rhs.Size() == 1 {
		return plan, false
	}
	large, small := lhs, rhs
	if lhs.Size() < rhs.Size() {
		large, small = rhs, lhs
		plan.smallIsLHS = true
	}
	pattern, ok := broadcast.Of(small.Dimensions, large.Dimensions)
	if !ok {
		return plan, false
	}
	plan.before, plan.within, plan.after = pattern.Before, pattern.Within, pattern.After
	return plan, true
}

// binaryExecutor returns the executor of one binary operation.
func binaryExecutor(opType backends.OpType) gomlxpatch.Executor {
	return func(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
		inputsOwned []bool) (*simplego.Buffer, error) {
		if output, ok := runBroadcast(opType, backend, inputs); ok {
			broadcastCalls.Add(1)
			return output, nil
		}
		return fallbacks[opType](backend, node, inputs, inputsOwned)
	}
}

func runBroadcast(opType backends.OpType, backend *simplego.Backend, inputs []*simplego.Buffer) (*simplego.Buffer, bool) {
	if len(inputs) != 2 {
		return nil, false
	}
	lhsShape, err1 := backend.BufferShape(inputs[0])
	rhsShape, err2 := backend.BufferShape(inputs[1])
	if err1 != nil || err2 != nil || lhsShape.DType != rhsShape.DType ||
		(lhsShape.DType != dtypes.Float32 && lhsShape.DType != dtypes.Float64) {
		return nil, false
	}
	plan, ok := planBroadcast(lhsShape, rhsShape)
	if !ok {
		return nil, false
	}
	largeShape := lhsShape
	if plan.smallIsLHS {
		largeShape = rhsShape
	}
	output := backend.NewBuffer(largeShape)
	if output == nil {
		return nil, false
	}
	lhs, err1 := backend.BufferData(inputs[0])
	rhs, err2 := backend.BufferData(inputs[1])
	out, err3 := backend.BufferData(output)
	if err1 != nil || err2 != nil || err3 != nil {
		_ = backend.BufferFinalize(output)
		return nil, false
	}
	switch largeShape.DType {
	case dtypes.Float32:
		broadcastOp(opType, plan, lhs.([]float32), rhs.([]float32), out.([]float32))
	case dtypes.Float64:
		broadcastOp(opType, plan, lhs.([]float64), rhs.([]float64), out.([]float64))
	}
	return output, true
}

// broadcastOp dispatches once per call to a loop written out for the operation, so the inner loops hold
// no call.
func broadcastOp[T float32 | float64](opType backends.OpType, plan broadcastPlan, lhs, rhs, out []T) {
	switch opType {
	case backends.OpTypeAdd:
		broadcastAdd(plan, lhs, rhs, out)
	case backends.OpTypeMul:
		broadcastMul(plan, lhs, rhs, out)
	case backends.OpTypeSub:
		broadcastSub(plan, lhs, rhs, out)
	case backends.OpTypeDiv:
		broadcastDiv(plan, lhs, rhs, out)
	case backends.OpTypeMax: // Commutative, like Add and Mul: the operands' order does not matter.
		blocks(plan, lhs, rhs, out, func(block, large, small []T) {
			for i := range block {
				block[i] = max(large[i], small[i])
			}
		}, func(block, large []T, s T) {
			for i := range block {
				block[i] = max(large[i], s)
			}
		})
	case backends.OpTypeMin:
		blocks(plan, lhs, rhs, out, func(block, large, small []T) {
			for i := range block {
				block[i] = min(large[i], small[i])
			}
		}, func(block, large []T, s T) {
			for i := range block {
				block[i] = min(large[i], s)
			}
		})
	}
}

// blocks calls fn for each block of the output with the large operand's matching block and, for a small
// operand that repeats whole (after = 1), its elements, or else the one small value the block pairs with.
func blocks[T float32 | float64](plan broadcastPlan, lhs, rhs, out []T, whole func(block, large, small []T),
	single func(block, large []T, small T)) {
	large, small := lhs, rhs
	if plan.smallIsLHS {
		large, small = rhs, lhs
	}
	within, after := plan.within, plan.after
	if after == 1 {
		for p := range plan.before {
			whole(out[p*within:(p+1)*within], large[p*within:(p+1)*within], small[:within])
		}
		return
	}
	for p := range plan.before {
		for m, s := range small[:within] {
			at := (p*within + m) * after
			single(out[at:at+after], large[at:at+after], s)
		}
	}
}

func broadcastMul[T float32 | float64](plan broadcastPlan, lhs, rhs, out []T) {
	blocks(plan, lhs, rhs, out, func(block, large, small []T) {
		for i := range block {
			block[i] = large[i] * small[i]
		}
	}, func(block, large []T, s T) {
		for i := range block {
			block[i] = large[i] * s
		}
	})
}

func broadcastSub[T float32 | float64](plan broadcastPlan, lhs, rhs, out []T) {
	if plan.smallIsLHS {
		blocks(plan, lhs, rhs, out, func(block, large, small []T) {
			for i := range block {
				block[i] = small[i] - large[i]
			}
		}, func(block, large []T, s T) {
			for i := range block {
				block[i] = s - large[i]
			}
		})
		return
	}
	blocks(plan, lhs, rhs, out, func(block, large, small []T) {
		for i := range block {
			block[i] = large[i] - small[i]
		}
	}, func(block, large []T, s T) {
		for i := range block {
			block[i] = large[i] - s
		}
	})
}

func broadcastDiv[T float32 | float64](plan broadcastPlan, lhs, rhs, out []T) {
	if plan.smallIsLHS {
		blocks(plan, lhs, rhs, out, func(block, large, small []T) {
			for i := range block {
				block[i] = small[i] / large[i]
			}
		}, func(block, large []T, s T) {
			for i := range block {
				block[i] = s / large[i]
			}
		})
		return
	}
	blocks(plan, lhs, rhs, out, func(block, large, small []T) {
		for i := range block {
			block[i] = large[i] / small[i]
		}
	}, func(block, large []T, s T) {
		for i := range block {
			block[i] = large[i] / s
		}
	})
}

// broadcastAdd is broadcastLoop for Add (commutative, so the operands' order does not matter), written out:
// biases make it the most frequent broadcast.
func broadcastAdd[T float32 | float64](plan broadcastPlan, lhs, rhs, out []T) {
	large, small := lhs, rhs
	if plan.smallIsLHS {
		large, small = rhs, lhs
	}
	within, after := plan.within, plan.after
	if after == 1 {
		small = small[:within]
		for p := range plan.before {
			block, from := out[p*within:(p+1)*within], large[p*within:(p+1)*within]
			for i := range block {
				block[i] = from[i] + small[i]
			}
		}
		return
	}
	for p := range plan.before {
		for m, s := range small[:within] {
			at := (p*within + m) * after
			block, from := out[at:at+after], large[at:at+after]
			for i := range block {
				block[i] = from[i] + s
			}
		}
	}
}
