package convkernel

import (
	"fmt"
	"math"
	"slices"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
	"github.com/goaccel/goaccel/cpu/internal/threads"
	"github.com/goaccel/goaccel/internal/vec32"
)

// reduceWindowParams mirrors simplego's unexported reduceWindowNode, the data of a ReduceWindow node.
type reduceWindowParams struct {
	reductionType                                             backends.ReduceOpType
	windowDimensions, strides, baseDilations, windowDilations []int
	paddings                                                  [][2]int
}

var reduceWindowMirror = gomlxpatch.DataMirror[reduceWindowParams]{TypeName: "reduceWindowNode"}

// originalReduceWindow is simplego's own ReduceWindow executor: the fallback for dilations, products and
// dtypes other than float32 and float64.
var originalReduceWindow gomlxpatch.Executor

// selectAndScatterParams is the data of the SelectAndScatterMax/Min nodes the extended builder creates.
type selectAndScatterParams struct {
	selectMax                 bool // else the minimum
	windowDimensions, strides []int
	paddings                  [][2]int
}

// windowPlan is a pooling window walked over an operand: per output position, the window's origin in the
// operand, and the flat offsets of the window's elements from it in row-major window order.
type windowPlan struct {
	operandDims, window, strides, lowPads, outputDims []int
	operandStrides                                    []int // Element stride of each operand axis.
	offsets                                           []int // Of every window element, from the origin.
	// crosses[axis][o] is true where the window at output position o of axis reaches into padding.
	crosses [][]bool
}

// newWindowPlan checks a pooling's parameters against the operand's dimensions (strides default to the
// window, paddings to none, as in simplego and XLA) and lays out its walk.
func newWindowPlan(operandDims, window, strides []int, paddings [][2]int) (*windowPlan, error) {
	rank := len(operandDims)
	if len(window) != rank || (len(strides) != 0 && len(strides) != rank) || (len(paddings) != 0 && len(paddings) != rank) {
		return nil, fmt.Errorf("operand %v, window %v, strides %v and paddings %v do not all have one value per axis",
			operandDims, window, strides, paddings)
	}
	p := &windowPlan{operandDims: operandDims, window: window, strides: make([]int, rank), lowPads: make([]int, rank),
		outputDims: make([]int, rank), operandStrides: make([]int, rank), crosses: make([][]bool, rank)}
	stride := 1
	for axis := rank - 1; axis >= 0; axis-- {
		p.operandStrides[axis] = stride
		stride *= operandDims[axis]
	}
	for axis := range rank {
		p.strides[axis] = window[axis]
		if len(strides) != 0 {
			p.strides[axis] = strides[axis]
		}
		var pad [2]int
		if len(paddings) != 0 {
			pad = paddings[axis]
		}
		p.lowPads[axis] = pad[0]
		span := operandDims[axis] + pad[0] + pad[1] - window[axis]
		if window[axis] < 1 || p.strides[axis] < 1 || span < 0 {
			return nil, fmt.Errorf("axis %d: operand %d, window %d, stride %d, padding %v leave no output",
				axis, operandDims[axis], window[axis], p.strides[axis], pad)
		}
		p.outputDims[axis] = span/p.strides[axis] + 1
		p.crosses[axis] = make([]bool, p.outputDims[axis])
		for o := range p.outputDims[axis] {
			origin := o*p.strides[axis] - pad[0]
			p.crosses[axis][o] = origin < 0 || origin+window[axis] > operandDims[axis]
		}
	}
	position := make([]int, rank)
	for {
		offset := 0
		for axis, at := range position {
			offset += at * p.operandStrides[axis]
		}
		p.offsets = append(p.offsets, offset)
		if !advance(position, window) {
			break
		}
	}
	return p, nil
}

// channelsLast2x2 reports whether the plan is the 2×2, stride-2 pooling of a channels-last image that tiles
// it exactly: [batch, height, width, channels] with window and strides [1, 2, 2, 1] and no padding.
func (p *windowPlan) channelsLast2x2() bool {
	return len(p.operandDims) == 4 && slices.Equal(p.window, []int{1, 2, 2, 1}) &&
		slices.Equal(p.strides, []int{1, 2, 2, 1}) && p.tiles()
}

// pool2x2Rows runs row(inputRow, outputRow) — the flat offsets where an output row's two input rows start
// and where it starts — for every output row of a channelsLast2x2 plan, one row of pixels × channels per
// call (the assembly's unit); it reports false, having run nothing, when the first call declines (the
// assembly does not run here, or the channels are not a multiple of 8). Rows are independent (the windows
// tile the operand), so a large operand's rows are split over the compute threads.
func pool2x2Rows(p *windowPlan, row func(inputRow, outputRow int) bool) bool {
	batch, outHeight := p.outputDims[0], p.outputDims[1]
	rows := batch * outHeight
	if rows == 0 {
		return true
	}
	run := func(i int) bool {
		b, y := i/outHeight, i%outHeight
		return row(b*p.operandStrides[0]+2*y*p.operandStrides[1], i*p.outputDims[2]*p.outputDims[3])
	}
	if !run(0) {
		return false
	}
	workers := 1
	if p.operandStrides[0]*batch >= parallelPoolElements {
		workers = min(threads.Budget(), rows-1)
	}
	threads.Split(workers, func(w int) {
		for i := 1 + (rows-1)*w/workers; i < 1+(rows-1)*(w+1)/workers; i++ {
			if !run(i) {
				panic("convkernel: a row of 2×2 pooling ran in assembly and the next did not")
			}
		}
	})
	return true
}

// parallelPoolElements is the operand size from which 2×2 pooling and its gradient split their rows over
// the compute threads (threads.Split).
const parallelPoolElements = 1 << 14

// tiles reports whether the windows cover the operand exactly once: stride equal to the window, no
// padding, and sizes that divide.
func (p *windowPlan) tiles() bool {
	for axis, dim := range p.operandDims {
		if p.strides[axis] != p.window[axis] || p.lowPads[axis] != 0 || p.outputDims[axis]*p.window[axis] != dim {
			return false
		}
	}
	return true
}

// walk visits the output positions in row-major order as runs along the innermost axis: visitRun gets the
// first output index of the run, its window origin's flat offset in the operand (possibly outside it), the
// run's length and the origin's step between consecutive outputs. A run is either a whole innermost row
// whose windows all lie inside the operand (crossing is nil), or a single output whose window reaches into
// padding (crossing is its output position, valid only during the call).
func (p *windowPlan) walk(visitRun func(index, origin, length, step int, crossing []int)) {
	rank := len(p.outputDims)
	last := rank - 1
	position := make([]int, rank)
	origin := 0
	for axis := range rank {
		origin -= p.lowPads[axis] * p.operandStrides[axis]
	}
	lastCrosses := slices.Contains(p.crosses[last], true)
	step := p.strides[last] * p.operandStrides[last]
	rowLength := p.outputDims[last]
	numOutputs := product(p.outputDims)
	for index := 0; index < numOutputs; index += rowLength {
		outerCrosses := false
		for axis := range last {
			if p.crosses[axis][position[axis]] {
				outerCrosses = true
				break
			}
		}
		if !outerCrosses && !lastCrosses {
			visitRun(index, origin, rowLength, step, nil)
		} else {
			for j := range rowLength {
				position[last] = j
				var crossing []int
				if outerCrosses || p.crosses[last][j] {
					crossing = position
				}
				visitRun(index+j, origin+j*step, 1, step, crossing)
			}
			position[last] = 0
		}
		for axis := last - 1; axis >= 0; axis-- {
			position[axis]++
			origin += p.strides[axis] * p.operandStrides[axis]
			if position[axis] < p.outputDims[axis] {
				break
			}
			origin -= p.outputDims[axis] * p.strides[axis] * p.operandStrides[axis]
			position[axis] = 0
		}
	}
}

// insideOffsets calls visit with the flat offset (from the window origin) of each element inside the
// operand of the window at output position outputPosition, one that reaches into padding.
func (p *windowPlan) insideOffsets(outputPosition []int, visit func(offset int)) {
	rank := len(p.operandDims)
	inWindow := make([]int, rank)
	for i := 0; ; i++ {
		inside := true
		for axis, at := range inWindow {
			if c := outputPosition[axis]*p.strides[axis] - p.lowPads[axis] + at; c < 0 || c >= p.operandDims[axis] {
				inside = false
				break
			}
		}
		if inside {
			visit(p.offsets[i])
		}
		if !advance(inWindow, p.window) {
			return
		}
	}
}

// execReduceWindow is the executor Install puts in simplego's table for ReduceWindow.
func execReduceWindow(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	output, handled, err := runReduceWindow(backend, node, inputs)
	if handled {
		return output, err
	}
	poolFallbacks.Add(1)
	return originalReduceWindow(backend, node, inputs, inputsOwned)
}

func runReduceWindow(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer) (
	output *simplego.Buffer, handled bool, err error) {
	params := reduceWindowMirror.Of(node)
	if params == nil || len(inputs) != 1 || hasDilation(params.baseDilations) || hasDilation(params.windowDilations) {
		return nil, false, nil
	}
	switch params.reductionType {
	case backends.ReduceOpMax, backends.ReduceOpMin, backends.ReduceOpSum:
	default:
		return nil, false, nil
	}
	shape, err := backend.BufferShape(inputs[0])
	if err != nil || (shape.DType != dtypes.Float32 && shape.DType != dtypes.Float64) {
		return nil, false, nil
	}
	plan, err := newWindowPlan(shape.Dimensions, params.windowDimensions, params.strides, params.paddings)
	if err != nil {
		return nil, true, fmt.Errorf("convkernel: ReduceWindow: %w", err)
	}
	output = backend.NewBuffer(shapes.Make(shape.DType, plan.outputDims...))
	if output == nil {
		return nil, true, fmt.Errorf("convkernel: ReduceWindow: backend is finalized")
	}
	operandFlat, err1 := backend.BufferData(inputs[0])
	outputFlat, err2 := backend.BufferData(output)
	if err := firstError(err1, err2); err != nil {
		_ = backend.BufferFinalize(output)
		return nil, true, err
	}
	switch shape.DType {
	case dtypes.Float32:
		reduceWindows(plan, params.reductionType, operandFlat.([]float32), outputFlat.([]float32))
	case dtypes.Float64:
		reduceWindows(plan, params.reductionType, operandFlat.([]float64), outputFlat.([]float64))
	}
	poolCalls.Add(1)
	return output, true, nil
}

func hasDilation(dilations []int) bool {
	for _, d := range dilations {
		if d > 1 {
			return true
		}
	}
	return false
}

// reduceWindows pools operand into output: max and min skip padding (its value is the reduction's
// identity) and propagate NaN, as XLA does; a window entirely in padding yields the identity.
func reduceWindows[T float32 | float64](p *windowPlan, reduction backends.ReduceOpType, operand, output []T) {
	offsets := p.offsets
	if reduction == backends.ReduceOpSum {
		p.walk(func(index, origin, length, step int, crossing []int) {
			if crossing != nil {
				var sum T
				p.insideOffsets(crossing, func(offset int) { sum += operand[origin+offset] })
				output[index] = sum
				return
			}
			for j := range length {
				var sum T
				for _, offset := range offsets {
					sum += operand[origin+offset]
				}
				output[index+j] = sum
				origin += step
			}
		})
		return
	}
	if out32, ok := any(output).([]float32); ok && p.channelsLast2x2() {
		in32 := any(operand).([]float32)
		if pool2x2Rows(p, func(row, pooledRow int) bool {
			return vec32.PoolRow2x2(reduction == backends.ReduceOpMin, out32[pooledRow:], in32[row:],
				p.operandDims[3], p.outputDims[2], p.operandStrides[1])
		}) {
			return
		}
	}
	identity := identityOf[T](reduction)
	pick := func(a, b T) T { return max(a, b) } // Go's max and min propagate NaN, as XLA does, with no branch.
	if reduction == backends.ReduceOpMin {
		pick = func(a, b T) T { return min(a, b) }
	}
	p.walk(func(index, origin, length, step int, crossing []int) {
		if crossing != nil {
			best, found := identity, false
			p.insideOffsets(crossing, func(offset int) {
				if v := operand[origin+offset]; found {
					best = pick(best, v)
				} else {
					best, found = v, true
				}
			})
			output[index] = best
			return
		}
		out := output[index : index+length]
		if len(offsets) == 4 && step == 1 {
			reduceRun4(reduction == backends.ReduceOpMax, operand[origin:], offsets, out)
			return
		}
		if reduction == backends.ReduceOpMax {
			for j := range out {
				best := operand[origin+offsets[0]]
				for _, offset := range offsets[1:] {
					best = max(best, operand[origin+offset])
				}
				out[j] = best
				origin += step
			}
			return
		}
		for j := range out {
			best := operand[origin+offsets[0]]
			for _, offset := range offsets[1:] {
				best = min(best, operand[origin+offset])
			}
			out[j] = best
			origin += step
		}
	})
}

// execSelectAndScatter is the executor of SelectAndScatterMax and SelectAndScatterMin, which simplego does
// not implement: inputs are the pooled operand and the gradient arriving at the pooling's output.
func execSelectAndScatter(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	_ []bool) (*simplego.Buffer, error) {
	params, ok := gomlxpatch.NodeData(node).(*selectAndScatterParams)
	if !ok || len(inputs) != 2 {
		return nil, fmt.Errorf("convkernel: SelectAndScatter node without its parameters (not built by convkernel's builder)")
	}
	operandShape, err1 := backend.BufferShape(inputs[0])
	sourceShape, err2 := backend.BufferShape(inputs[1])
	if err := firstError(err1, err2); err != nil {
		return nil, err
	}
	plan, err := newWindowPlan(operandShape.Dimensions, params.windowDimensions, params.strides, params.paddings)
	if err != nil {
		return nil, fmt.Errorf("convkernel: SelectAndScatter: %w", err)
	}
	if !shapes.Make(operandShape.DType, plan.outputDims...).Equal(sourceShape) {
		return nil, fmt.Errorf("convkernel: SelectAndScatter: source %s does not match the pooled shape of %s",
			sourceShape, operandShape)
	}
	output := backend.NewBuffer(operandShape)
	if output == nil {
		return nil, fmt.Errorf("convkernel: SelectAndScatter: backend is finalized")
	}
	operandFlat, err1 := backend.BufferData(inputs[0])
	sourceFlat, err2 := backend.BufferData(inputs[1])
	outputFlat, err3 := backend.BufferData(output)
	if err := firstError(err1, err2, err3); err != nil {
		_ = backend.BufferFinalize(output)
		return nil, err
	}
	switch operandShape.DType {
	case dtypes.Float32:
		selectAndScatter(plan, params.selectMax, operandFlat.([]float32), sourceFlat.([]float32), outputFlat.([]float32))
	case dtypes.Float64:
		selectAndScatter(plan, params.selectMax, operandFlat.([]float64), sourceFlat.([]float64), outputFlat.([]float64))
	default:
		_ = backend.BufferFinalize(output)
		return nil, fmt.Errorf("convkernel: SelectAndScatter of %s: only float32 and float64 are implemented", operandShape.DType)
	}
	scatterCalls.Add(1)
	return output, nil
}

// selectAndScatter adds each source value at the first position (row-major in its window) holding its
// window's maximum (minimum) of operand; padding is never selected, and a window entirely in padding
// scatters nothing. The inner comparisons assign without branching (the compiler emits conditional
// moves): on real activations the winner is unpredictable, and mispredicted branches cost more than the
// loads.
func selectAndScatter[T float32 | float64](p *windowPlan, selectMax bool, operand, source, output []T) {
	sign := T(1)
	if !selectMax {
		sign = -1
	}
	offsets := p.offsets
	if out32, ok := any(output).([]float32); ok && p.channelsLast2x2() {
		in32, source32 := any(operand).([]float32), any(source).([]float32)
		if pool2x2Rows(p, func(row, pooledRow int) bool {
			return vec32.ScatterPoolRow2x2(float32(sign), out32[row:], in32[row:], source32[pooledRow:],
				p.operandDims[3], p.outputDims[2], p.operandStrides[1])
		}) {
			return
		}
	}
	if p.tiles() && len(offsets) <= maxTiledWindow {
		// Every operand element is in exactly one window: write each window whole, the source value at the
		// chosen position and zeros elsewhere (through a small array, so no store depends on a branch),
		// with no clearing pass and no read-modify-write.
		p.walk(func(index, origin, length, step int, _ []int) {
			if len(offsets) == 4 && step == 1 {
				selectAndScatterRun4(sign, operand[origin:], offsets, source[index:index+length], output[origin:])
				return
			}
			var window [maxTiledWindow]T
			for _, value := range source[index : index+length] {
				chosen := 0
				best := sign * operand[origin+offsets[0]]
				for k := 1; k < len(offsets); k++ {
					v := sign * operand[origin+offsets[k]]
					chosen = pickInt(v > best, k, chosen)
					best = max(best, v)
				}
				window[chosen] = value
				for k, offset := range offsets {
					output[origin+offset] = window[k]
				}
				window[chosen] = 0
				origin += step
			}
		})
		return
	}
	clear(output)
	p.walk(func(index, origin, length, step int, crossing []int) {
		if crossing != nil {
			chosen, found := 0, false
			p.insideOffsets(crossing, func(offset int) {
				if !found || sign*operand[origin+offset] > sign*operand[origin+chosen] {
					chosen, found = offset, true
				}
			})
			if found {
				output[origin+chosen] += source[index]
			}
			return
		}
		for _, value := range source[index : index+length] {
			chosen := offsets[0]
			best := sign * operand[origin+chosen]
			for _, offset := range offsets[1:] {
				v := sign * operand[origin+offset]
				chosen = pickInt(v > best, offset, chosen)
				best = max(best, v)
			}
			output[origin+chosen] += value
			origin += step
		}
	})
}

// The 2×2 windows of channels-last pooling, its most common form, make runs whose consecutive outputs read
// consecutive operand elements (step 1): reduceRun4 and selectAndScatterRun4 read the four window positions
// as four streams, which the compiler checks once per run instead of at every element, and unroll the
// window. Each gives the general loop's result exactly.

// reduceRun4 pools a run of 4-element windows starting at operand[0]: out[j] is the max (or min) of
// operand[j+offsets[k]], in the general loop's order.
func reduceRun4[T float32 | float64](selectMax bool, operand []T, offsets []int, out []T) {
	n := len(out)
	a, b := operand[offsets[0]:offsets[0]+n], operand[offsets[1]:offsets[1]+n]
	c, d := operand[offsets[2]:offsets[2]+n], operand[offsets[3]:offsets[3]+n]
	if out32, ok := any(out).([]float32); ok && vec32.Accelerated() {
		// Three vectorised passes over a run that stays in the first-level cache: the same max (or min)
		// operations, in the same order.
		op := vec32.Max
		if !selectMax {
			op = vec32.Min
		}
		vec32.Binary(op, out32, any(a).([]float32), any(b).([]float32))
		vec32.Binary(op, out32, out32, any(c).([]float32))
		vec32.Binary(op, out32, out32, any(d).([]float32))
		return
	}
	if selectMax {
		for j := range out {
			out[j] = max(max(max(a[j], b[j]), c[j]), d[j])
		}
		return
	}
	for j := range out {
		out[j] = min(min(min(a[j], b[j]), c[j]), d[j])
	}
}

// selectAndScatterRun4 writes a run of whole tiling 4-element windows: the source value where the window's
// first largest (sign 1) or smallest (sign −1) operand is, zeros at its other three positions.
func selectAndScatterRun4[T float32 | float64](sign T, operand []T, offsets []int, source, output []T) {
	n := len(source)
	a, b := operand[offsets[0]:offsets[0]+n], operand[offsets[1]:offsets[1]+n]
	c, d := operand[offsets[2]:offsets[2]+n], operand[offsets[3]:offsets[3]+n]
	outA, outB := output[offsets[0]:offsets[0]+n], output[offsets[1]:offsets[1]+n]
	outC, outD := output[offsets[2]:offsets[2]+n], output[offsets[3]:offsets[3]+n]
	done := 0
	if source32, ok := any(source).([]float32); ok {
		f32 := func(x []T) []float32 { return any(x).([]float32) }
		done = vec32.Scatter4Prefix(float32(sign), f32(outA), f32(outB), f32(outC), f32(outD), f32(a), f32(b), f32(c),
			f32(d), source32)
	}
	for j := done; j < n; j++ {
		value := source[j]
		best, chosen := sign*a[j], 0
		v := sign * b[j]
		chosen = pickInt(v > best, 1, chosen)
		best = max(best, v)
		v = sign * c[j]
		chosen = pickInt(v > best, 2, chosen)
		best = max(best, v)
		chosen = pickInt(sign*d[j] > best, 3, chosen)
		outA[j], outB[j] = keepIf(chosen == 0, value), keepIf(chosen == 1, value)
		outC[j], outD[j] = keepIf(chosen == 2, value), keepIf(chosen == 3, value)
	}
}

// keepIf is value if cond, else +0, without a branch: a mask of the value's bits, all ones or all zeros
// (Go emits conditional moves for integers, not for floats).
func keepIf[T float32 | float64](cond bool, value T) T {
	var mask uint64
	if cond {
		mask = ^uint64(0)
	}
	if bits, ok := any(value).(float32); ok {
		return T(math.Float32frombits(math.Float32bits(bits) & uint32(mask)))
	}
	return T(math.Float64frombits(math.Float64bits(float64(value)) & mask))
}

// maxTiledWindow bounds the windows selectAndScatter writes whole (4×4 and smaller).
const maxTiledWindow = 16

// pickInt is a if cond, else b, written so the compiler emits a conditional move.
func pickInt(cond bool, a, b int) int {
	if cond {
		b = a
	}
	return b
}

// identityOf returns the identity of a max (the lowest value) or min (the highest) reduction.
func identityOf[T float32 | float64](reduction backends.ReduceOpType) T {
	dtype := dtypes.Float32
	if _, ok := any(T(0)).(float64); ok {
		dtype = dtypes.Float64
	}
	if reduction == backends.ReduceOpMax {
		return dtype.LowestValue().(T)
	}
	return dtype.HighestValue().(T)
}
