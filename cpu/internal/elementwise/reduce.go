package elementwise

import (
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/broadcast"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
	"github.com/goaccel/goaccel/internal/vec32"
)

// reduceOps are the reductions Install speeds up when their axes are contiguous: simplego maps every
// operand element to its output through a per-element iterator; with the operand seen as
// [before, reduced, after], the reduction is a run of sums (after = 1: softmax's and layer norm's last
// axis) or of row accumulations (bias gradients over the batch and spatial axes). The order in which
// each output accumulates its inputs is simplego's, so sums are bitwise the same — except float32 sums
// over a run of 32 elements or more along the last axes, which reduce32 folds into 32 running sums.
var reduceOps = []backends.OpType{backends.OpTypeReduceSum, backends.OpTypeReduceMax, backends.OpTypeReduceMin}

var reduceCalls atomicCounter

// reducePlan is a reduction over contiguous axes of an operand seen as [before, reduced, after].
type reducePlan struct {
	before, reduced, after int
	outputDims             []int
}

// planReduce returns the plan for reducing axes of dims; ok is false when the axes are not contiguous.
func planReduce(dims, axes []int) (plan reducePlan, ok bool) {
	if len(axes) == 0 {
		return plan, false
	}
	isReduced := make([]bool, len(dims))
	for _, axis := range axes {
		if axis < 0 || axis >= len(dims) || isReduced[axis] {
			return plan, false
		}
		isReduced[axis] = true
	}
	first, last := len(dims), -1
	for axis, reduced := range isReduced {
		if reduced {
			first, last = min(first, axis), max(last, axis)
		} else {
			plan.outputDims = append(plan.outputDims, dims[axis])
		}
	}
	if last-first+1 != len(axes) {
		return plan, false // A hole between reduced axes.
	}
	plan.before, plan.reduced, plan.after = broadcast.Product(dims[:first]), broadcast.Product(dims[first:last+1]), broadcast.Product(dims[last+1:])
	return plan, true
}

func reduceExecutor(opType backends.OpType) gomlxpatch.Executor {
	return func(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
		inputsOwned []bool) (*simplego.Buffer, error) {
		if output, ok := runReduce(opType, backend, node, inputs); ok {
			reduceCalls.Add(1)
			return output, nil
		}
		return fallbacks[opType](backend, node, inputs, inputsOwned)
	}
}

func runReduce(opType backends.OpType, backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer) (
	*simplego.Buffer, bool) {
	axes, ok := gomlxpatch.NodeData(node).([]int)
	if !ok || len(inputs) != 1 {
		return nil, false
	}
	shape, err := backend.BufferShape(inputs[0])
	if err != nil || (shape.DType != dtypes.Float32 && shape.DType != dtypes.Float64) {
		return nil, false
	}
	plan, ok := planReduce(shape.Dimensions, axes)
	if !ok {
		return nil, false
	}
	output := backend.NewBuffer(shapes.Make(shape.DType, plan.outputDims...))
	if output == nil {
		return nil, false
	}
	in, err1 := backend.BufferData(inputs[0])
	out, err2 := backend.BufferData(output)
	if err1 != nil || err2 != nil {
		_ = backend.BufferFinalize(output)
		return nil, false
	}
	switch shape.DType {
	case dtypes.Float32:
		reduce(opType, plan, in.([]float32), out.([]float32))
	case dtypes.Float64:
		reduce(opType, plan, in.([]float64), out.([]float64))
	}
	return output, true
}

func reduce[T float32 | float64](opType backends.OpType, plan reducePlan, in, out []T) {
	if in32, ok := any(in).([]float32); ok {
		reduce32(opType, plan, in32, any(out).([]float32))
		return
	}
	switch opType {
	case backends.OpTypeReduceSum:
		reduceSum(plan, in, out)
	case backends.OpTypeReduceMax:
		reduceLoop(plan, in, out, identityOf[T](true), func(acc, v T) T { return max(acc, v) })
	case backends.OpTypeReduceMin:
		reduceLoop(plan, in, out, identityOf[T](false), func(acc, v T) T { return min(acc, v) })
	}
}

// reduceLoop starts each output at initial (as simplego does) and folds its inputs in operand order.
func reduceLoop[T float32 | float64](plan reducePlan, in, out []T, initial T, fold func(acc, v T) T) {
	reduced, after := plan.reduced, plan.after
	if after == 1 {
		for b := range plan.before {
			acc := initial
			for _, v := range in[b*reduced : (b+1)*reduced] {
				acc = fold(acc, v)
			}
			out[b] = acc
		}
		return
	}
	foldRows(plan, in, out, initial, func(row, from []T) {
		for i, v := range from {
			row[i] = fold(row[i], v)
		}
	})
}

// foldRows is a reduction with after > 1 as row accumulations: each output row of after elements starts at
// initial and folds in the operand's reduced rows, in operand order.
func foldRows[T float32 | float64](plan reducePlan, in, out []T, initial T, foldRow func(row, from []T)) {
	reduced, after := plan.reduced, plan.after
	for b := range plan.before {
		row := out[b*after : (b+1)*after]
		for i := range row {
			row[i] = initial
		}
		for r := range reduced {
			at := (b*reduced + r) * after
			foldRow(row, in[at:at+after])
		}
	}
}

// identityOf is the lowest value of T (the start of a max) or the highest (of a min).
func identityOf[T float32 | float64](forMax bool) T {
	dtype := dtypes.Float32
	if _, ok := any(T(0)).(float64); ok {
		dtype = dtypes.Float64
	}
	if forMax {
		return dtype.LowestValue().(T)
	}
	return dtype.HighestValue().(T)
}

// reduceSum is reduceLoop for sums, written out: the hottest reduction (bias gradients, softmax and
// normalisation sums) without a call per element.
func reduceSum[T float32 | float64](plan reducePlan, in, out []T) {
	reduced, after := plan.reduced, plan.after
	if after == 1 {
		for b := range plan.before {
			var acc T
			for _, v := range in[b*reduced : (b+1)*reduced] {
				acc += v
			}
			out[b] = acc
		}
		return
	}
	foldRows(plan, in, out, 0, func(row, from []T) {
		for i := range row {
			row[i] += from[i]
		}
	})
}

// reduce32 is reduce in float32 on vec32's loops. Row accumulations (after > 1: bias gradients) add each
// row in operand order, as the Go loops do. Runs (after = 1: softmax's and layer norm's last axis) fold into
// 32 running values combined pairwise (vec32.Sum): for sums of 32 or more elements that is another order
// than simplego's single running sum, and a more accurate one; maxima and minima do not depend on the order.
func reduce32(opType backends.OpType, plan reducePlan, in, out []float32) {
	reduced, after := plan.reduced, plan.after
	op, initial := vec32.Add, float32(0)
	switch opType {
	case backends.OpTypeReduceMax:
		op, initial = vec32.Max, identityOf[float32](true)
	case backends.OpTypeReduceMin:
		op, initial = vec32.Min, identityOf[float32](false)
	}
	if after == 1 {
		for b := range plan.before {
			run := in[b*reduced : (b+1)*reduced]
			switch opType {
			case backends.OpTypeReduceSum:
				out[b] = vec32.Sum(run)
			case backends.OpTypeReduceMax:
				out[b] = vec32.MaxOf(run, initial)
			default:
				out[b] = vec32.MinOf(run, initial)
			}
		}
		return
	}
	if opType == backends.OpTypeReduceSum && after >= 16 && after < 64 {
		// Narrow rows (a convolution's bias gradient sums [b·h·w, channels]): a call per row of 16 to 63
		// elements costs more than its additions. Columns in blocks of 16 with their sums in registers, the
		// rows still added in operand order.
		for b := range plan.before {
			block, sums := in[b*reduced*after:(b+1)*reduced*after], out[b*after:(b+1)*after]
			col := 0
			for ; col+16 <= after; col += 16 {
				sumColumns16(sums[col:col+16], block[col:], reduced, after)
			}
			if col < after {
				clear(sums[col:])
				for r := range reduced {
					for i, v := range block[r*after+col : (r+1)*after] {
						sums[col+i] += v
					}
				}
			}
		}
		return
	}
	foldRows(plan, in, out, initial, func(row, from []float32) { vec32.Binary(op, row, row, from) })
}

// sumColumns16 sets sums to the column sums of 16 columns of rows rows, stride apart in in: each starts at 0
// and adds its column's values in row order, as foldRows does.
func sumColumns16(sums, in []float32, rows, stride int) {
	var s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 float32
	for r := range rows {
		v := in[r*stride : r*stride+16 : r*stride+16]
		s0 += v[0]
		s1 += v[1]
		s2 += v[2]
		s3 += v[3]
		s4 += v[4]
		s5 += v[5]
		s6 += v[6]
		s7 += v[7]
		s8 += v[8]
		s9 += v[9]
		s10 += v[10]
		s11 += v[11]
		s12 += v[12]
		s13 += v[13]
		s14 += v[14]
		s15 += v[15]
	}
	sums = sums[:16]
	sums[0], sums[1], sums[2], sums[3], sums[4], sums[5], sums[6], sums[7] = s0, s1, s2, s3, s4, s5, s6, s7
	sums[8], sums[9], sums[10], sums[11], sums[12], sums[13], sums[14], sums[15] = s8, s9, s10, s11, s12, s13, s14, s15
}
