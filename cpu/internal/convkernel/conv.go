package convkernel

import (
	"fmt"
	"slices"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/blas"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// convParams mirrors the leading fields of simplego's unexported convNode, which Builder.ConvGeneral stores
// (as a pointer) in the node's data field.
type convParams struct {
	axes              backends.ConvolveAxesConfig
	strides           []int
	paddings          [][2]int
	inputDilations    []int
	kernelDilations   []int
	channelGroupCount int
	batchGroupCount   int
}

var convMirror = gomlxpatch.DataMirror[convParams]{TypeName: "convNode"}

// originalConvGeneral is simplego's own ConvGeneral executor, the fallback for grouped convolutions and
// dtypes other than float32 and float64.
var originalConvGeneral gomlxpatch.Executor

// execConvGeneral is the executor Install puts in simplego's table for ConvGeneral.
func execConvGeneral(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	output, handled, err := runConvGeneral(backend, node, inputs)
	if handled {
		return output, err
	}
	convFallbacks.Add(1)
	return originalConvGeneral(backend, node, inputs, inputsOwned)
}

// convPlan is one ConvGeneral as im2col + gemm, in the canonical layouts input [batch, spatial..., in],
// kernel [spatial..., in, out] and output [batch, spatial..., out]; the permutations move the node's
// layouts to and from them (nil where a layout already is canonical).
type convPlan struct {
	batch, inChannels, outChannels  int
	inputDims, kernelDims           []int // The node's operand dimensions, in their own layouts.
	inputSpatial, kernelSpatial     []int // Spatial sizes, in canonical order.
	outputSpatial                   []int
	strides, lowPads                []int
	inputDilations, kernelDilations []int
	// inputPerm and kernelPerm take the operands to canonical order (canonical axis i is operand axis
	// perm[i]); outputPerm takes the canonical output to the node's layout (node axis i is canonical axis
	// outputPerm[i]).
	inputPerm, kernelPerm, outputPerm []int
	outputDims                        []int // In the node's layout.
	// dual is set when the operands' natural layouts are [in, spatial..., batch] (input),
	// [in, spatial..., out] (kernel) and [spatial..., batch, out] (output): the kernel gradient of a
	// channels-last convolution, whose batch and channels trade roles. Packing the patches with the
	// contraction as rows and multiplying with the packed matrix transposed reads both operands and
	// writes the output in place, with no transposes.
	dual bool
}

func (p *convPlan) numSpatial() int      { return len(p.inputSpatial) }
func (p *convPlan) rows() int            { return p.batch * product(p.outputSpatial) }
func (p *convPlan) kernelPositions() int { return product(p.kernelSpatial) }
func (p *convPlan) patchLength() int     { return p.kernelPositions() * p.inChannels }
func (p *convPlan) canonicalOutput() []int {
	return slices.Concat([]int{p.batch}, p.outputSpatial, []int{p.outChannels})
}

// isPointwise reports whether the patches are the input itself: a 1×…×1 kernel read at every position.
func (p *convPlan) isPointwise() bool {
	for i := range p.kernelSpatial {
		if p.kernelSpatial[i] != 1 || p.strides[i] != 1 || p.lowPads[i] != 0 || p.inputDilations[i] != 1 ||
			p.outputSpatial[i] != p.inputSpatial[i] {
			return false
		}
	}
	return true
}

// newConvPlan checks a ConvGeneral's parameters against its operands' shapes; ok is false for what it
// leaves to simplego (channel or batch grouping).
func newConvPlan(input, kernel shapes.Shape, params *convParams) (plan *convPlan, ok bool, err error) {
	if params.channelGroupCount > 1 || params.batchGroupCount > 1 {
		return nil, false, nil
	}
	axes := params.axes
	rank := input.Rank()
	numSpatial := rank - 2
	if kernel.Rank() != rank || numSpatial < 1 || len(axes.InputSpatial) != numSpatial ||
		len(axes.KernelSpatial) != numSpatial || len(axes.OutputSpatial) != numSpatial {
		return nil, false, fmt.Errorf("input %s and kernel %s do not fit axes %+v", input, kernel, axes)
	}
	p := &convPlan{
		batch:       input.Dimensions[axes.InputBatch],
		inChannels:  input.Dimensions[axes.InputChannels],
		outChannels: kernel.Dimensions[axes.KernelOutputChannels],
		inputDims:   input.Dimensions,
		kernelDims:  kernel.Dimensions,
	}
	if kernel.Dimensions[axes.KernelInputChannels] != p.inChannels {
		return nil, false, fmt.Errorf("input %s has %d channels, kernel %s expects %d", input, p.inChannels,
			kernel, kernel.Dimensions[axes.KernelInputChannels])
	}
	valueOr := func(values []int, i int) int {
		if i < len(values) && values[i] > 0 {
			return values[i]
		}
		return 1
	}
	for i := range numSpatial {
		inSize, kSize := input.Dimensions[axes.InputSpatial[i]], kernel.Dimensions[axes.KernelSpatial[i]]
		stride, inDil, kDil := valueOr(params.strides, i), valueOr(params.inputDilations, i), valueOr(params.kernelDilations, i)
		var pad [2]int
		if i < len(params.paddings) {
			pad = params.paddings[i]
		}
		span := pad[0] + pad[1] + (inSize-1)*inDil + 1 - ((kSize-1)*kDil + 1)
		if inSize < 1 || kSize < 1 || span < 0 {
			return nil, false, fmt.Errorf("spatial axis %d: input %d, kernel %d, padding %v, dilations %d/%d "+
				"leave no output", i, inSize, kSize, pad, inDil, kDil)
		}
		p.inputSpatial = append(p.inputSpatial, inSize)
		p.kernelSpatial = append(p.kernelSpatial, kSize)
		p.outputSpatial = append(p.outputSpatial, span/stride+1)
		p.strides = append(p.strides, stride)
		p.lowPads = append(p.lowPads, pad[0])
		p.inputDilations = append(p.inputDilations, inDil)
		p.kernelDilations = append(p.kernelDilations, kDil)
	}
	inputOrder := slices.Concat([]int{axes.InputBatch}, axes.InputSpatial, []int{axes.InputChannels})
	kernelOrder := slices.Concat(axes.KernelSpatial, []int{axes.KernelInputChannels, axes.KernelOutputChannels})
	nodeOutputAxes := slices.Concat([]int{axes.OutputBatch}, axes.OutputSpatial, []int{axes.OutputChannels})
	if !isPermutation(inputOrder, rank) || !isPermutation(kernelOrder, rank) || !isPermutation(nodeOutputAxes, rank) {
		return nil, false, fmt.Errorf("axes %+v do not each name every axis of rank %d once", axes, rank)
	}
	p.inputPerm, p.kernelPerm = nonIdentity(inputOrder), nonIdentity(kernelOrder)
	p.dual = numSpatial <= 2 && slices.Equal(axes.InputSpatial, seq(1, numSpatial)) &&
		axes.InputChannels == 0 && axes.InputBatch == numSpatial+1 &&
		axes.KernelInputChannels == 0 && slices.Equal(axes.KernelSpatial, seq(1, numSpatial)) &&
		axes.KernelOutputChannels == numSpatial+1 &&
		slices.Equal(axes.OutputSpatial, seq(0, numSpatial)) && axes.OutputBatch == numSpatial &&
		axes.OutputChannels == numSpatial+1
	// Canonical output axis c lands on node axis nodeOutputAxes[c]; invert it for TransposeInto.
	outputPerm := make([]int, rank)
	for canonical, nodeAxis := range nodeOutputAxes {
		outputPerm[nodeAxis] = canonical
	}
	p.outputPerm = nonIdentity(outputPerm)
	canonical := p.canonicalOutput()
	p.outputDims = make([]int, rank)
	for nodeAxis, c := range outputPerm {
		p.outputDims[nodeAxis] = canonical[c]
	}
	return p, true, nil
}

// runConvGeneral computes the node on the gemm kernel; handled is false when it cannot.
func runConvGeneral(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer) (
	output *simplego.Buffer, handled bool, err error) {
	if len(inputs) != 2 {
		return nil, false, nil
	}
	params := convMirror.Of(node)
	if params == nil {
		return nil, false, nil
	}
	inputShape, err1 := backend.BufferShape(inputs[0])
	kernelShape, err2 := backend.BufferShape(inputs[1])
	if err1 != nil || err2 != nil {
		return nil, false, nil
	}
	dtype := inputShape.DType
	if (dtype != dtypes.Float32 && dtype != dtypes.Float64) || kernelShape.DType != dtype {
		return nil, false, nil
	}
	plan, ok, err := newConvPlan(inputShape, kernelShape, params)
	if !ok {
		return nil, err != nil, err
	}
	output = backend.NewBuffer(shapes.Make(dtype, plan.outputDims...))
	if output == nil {
		return nil, true, fmt.Errorf("convkernel: ConvGeneral: backend is finalized")
	}
	inputFlat, err1 := backend.BufferData(inputs[0])
	kernelFlat, err2 := backend.BufferData(inputs[1])
	outputFlat, err3 := backend.BufferData(output)
	if err := firstError(err1, err2, err3); err != nil {
		_ = backend.BufferFinalize(output)
		return nil, true, err
	}
	switch dtype {
	case dtypes.Float32:
		convolve(plan, inputFlat.([]float32), kernelFlat.([]float32), outputFlat.([]float32), &scratch32,
			canRunDirect(plan))
	case dtypes.Float64:
		convolve(plan, inputFlat.([]float64), kernelFlat.([]float64), outputFlat.([]float64), &scratch64, false)
	}
	convCalls.Add(1)
	return output, true, nil
}

// convolve computes output (in the node's layout) from input and kernel (in theirs): operands moved to
// canonical order where they are not, then either the product of the patches with the kernel computed
// directly on the float32 micro-kernel (direct, see convolveDirect), or the patches packed into a reused
// buffer and one gemm.
func convolve[T float32 | float64](p *convPlan, input, kernel, output []T, pool *scratchPool[T], direct bool) {
	if p.dual && direct {
		convolveDirectDual(p, any(input).([]float32), any(kernel).([]float32), any(output).([]float32),
			any(pool).(*scratchPool[float32]))
		return
	}
	if p.dual {
		patches := pool.get(p.rows() * p.patchLength())
		defer pool.put(patches)
		im2colDual(p, patches, input)
		// patches: [inChannels·kernelPositions, outputPositions·batch]; kernel: [inChannels·kernelPositions, out].
		blas.Gemm(p.rows(), p.outChannels, p.patchLength(), true, false, patches, kernel, output)
		return
	}
	if p.inputPerm != nil {
		canonical := pool.get(len(input))
		defer pool.put(canonical)
		blas.TransposeInto(canonical, input, p.inputDims, p.inputPerm)
		input = canonical
	}
	if p.kernelPerm != nil {
		canonical := pool.get(len(kernel))
		defer pool.put(canonical)
		blas.TransposeInto(canonical, kernel, p.kernelDims, p.kernelPerm)
		kernel = canonical
	}
	if direct {
		product := output
		if p.outputPerm != nil {
			product = pool.get(len(output))
			defer pool.put(product)
		}
		convolveDirect(p, any(input).([]float32), any(kernel).([]float32), any(product).([]float32),
			any(pool).(*scratchPool[float32]))
		if p.outputPerm != nil {
			blas.TransposeInto(output, product, p.canonicalOutput(), p.outputPerm)
		}
		return
	}
	patches := input
	if !p.isPointwise() {
		patches = pool.get(p.rows() * p.patchLength())
		defer pool.put(patches)
		im2col(p, patches, input)
	}
	product := output
	if p.outputPerm != nil {
		product = pool.get(len(output))
		defer pool.put(product)
	}
	blas.Gemm(p.rows(), p.outChannels, p.patchLength(), false, false, patches, kernel, product)
	if p.outputPerm != nil {
		blas.TransposeInto(output, product, p.canonicalOutput(), p.outputPerm)
	}
}

// positionTable lists, for each output position o and kernel position k of one spatial axis, the input
// index the pair reads (o·stride + k·kernelDilation − lowPad in the dilated, padded input), or −1 where
// that falls on padding or on a hole that input dilation inserts.
func positionTable(outputSize, kernelSize, inputSize, stride, kernelDilation, inputDilation, lowPad int) []int {
	table := make([]int, outputSize*kernelSize)
	dilatedSize := (inputSize-1)*inputDilation + 1
	for o := range outputSize {
		for k := range kernelSize {
			at := o*stride + k*kernelDilation - lowPad
			index := -1
			if at >= 0 && at < dilatedSize && at%inputDilation == 0 {
				index = at / inputDilation
			}
			table[o*kernelSize+k] = index
		}
	}
	return table
}

// im2col writes the patches of the canonical input into patches, [batch·outputPositions,
// kernelPositions·inChannels] row-major: row (b, o) holds, for every kernel position k, the input channels
// read at o by k (zeros on padding).
func im2col[T float32 | float64](p *convPlan, patches, input []T) {
	numSpatial := p.numSpatial()
	tables := make([][]int, numSpatial)
	for i := range numSpatial {
		tables[i] = positionTable(p.outputSpatial[i], p.kernelSpatial[i], p.inputSpatial[i], p.strides[i],
			p.kernelDilations[i], p.inputDilations[i], p.lowPads[i])
	}
	switch numSpatial {
	case 1:
		im2col2D(patches, input, p.batch, 1, p.inputSpatial[0], p.inChannels, 1, p.outputSpatial[0], 1,
			p.kernelSpatial[0], []int{0}, tables[0])
	case 2:
		im2col2D(patches, input, p.batch, p.inputSpatial[0], p.inputSpatial[1], p.inChannels, p.outputSpatial[0],
			p.outputSpatial[1], p.kernelSpatial[0], p.kernelSpatial[1], tables[0], tables[1])
	default:
		im2colND(p, patches, input, tables)
	}
}

// im2col2D is im2col for two spatial axes (one, with a unit first axis), the common case, as plain loops.
func im2col2D[T float32 | float64](patches, input []T, batch, height, width, channels, outHeight, outWidth,
	kernelHeight, kernelWidth int, rowTable, colTable []int) {
	at := 0
	imageSize := height * width * channels
	// At an output column whose kernel columns read consecutive input columns (stride and dilation 1, no
	// padding), a patch row is one contiguous run of the input line: one copy instead of one per column.
	firstCols := consecutiveRuns(colTable, outWidth, kernelWidth)
	span := kernelWidth * channels
	for b := range batch {
		image := input[b*imageSize : (b+1)*imageSize]
		for oh := range outHeight {
			rows := rowTable[oh*kernelHeight : (oh+1)*kernelHeight]
			for ow := range outWidth {
				cols := colTable[ow*kernelWidth : (ow+1)*kernelWidth]
				for _, ih := range rows {
					if ih < 0 {
						clear(patches[at : at+span])
						at += span
						continue
					}
					line := image[ih*width*channels : (ih+1)*width*channels]
					if first := firstCols[ow]; first >= 0 {
						run := line[first*channels : first*channels+span]
						if span <= smallCopy {
							dst := patches[at : at+span]
							for i := range dst {
								dst[i] = run[i]
							}
						} else {
							copy(patches[at:at+span], run)
						}
						at += span
						continue
					}
					if channels == 1 {
						for _, iw := range cols {
							if iw < 0 {
								patches[at] = 0
							} else {
								patches[at] = line[iw]
							}
							at++
						}
						continue
					}
					for _, iw := range cols {
						if iw < 0 {
							clear(patches[at : at+channels])
						} else {
							copy(patches[at:at+channels], line[iw*channels:(iw+1)*channels])
						}
						at += channels
					}
				}
			}
		}
	}
}

// im2colND is im2col for three or more spatial axes, walking output and kernel positions with odometers.
func im2colND[T float32 | float64](p *convPlan, patches, input []T, tables [][]int) {
	numSpatial := p.numSpatial()
	channels := p.inChannels
	inputStrides := make([]int, numSpatial) // Element stride of each spatial axis in the canonical input.
	stride := channels
	for i := numSpatial - 1; i >= 0; i-- {
		inputStrides[i] = stride
		stride *= p.inputSpatial[i]
	}
	imageSize := stride
	outPos, kPos := make([]int, numSpatial), make([]int, numSpatial)
	at := 0
	for b := range p.batch {
		image := input[b*imageSize : (b+1)*imageSize]
		clear(outPos)
		for {
			clear(kPos)
			for {
				offset, valid := 0, true
				for i := range numSpatial {
					index := tables[i][outPos[i]*p.kernelSpatial[i]+kPos[i]]
					if index < 0 {
						valid = false
						break
					}
					offset += index * inputStrides[i]
				}
				if valid {
					copy(patches[at:at+channels], image[offset:offset+channels])
				} else {
					clear(patches[at : at+channels])
				}
				at += channels
				if !advance(kPos, p.kernelSpatial) {
					break
				}
			}
			if !advance(outPos, p.outputSpatial) {
				break
			}
		}
	}
}

// im2colDual writes the patches of an input stored [in, spatial..., batch] as the transpose of im2col's
// matrix: row (c, k) for input channel c and kernel position k, column (o, b) for output position o and
// batch item b, so the batch items read at each pair are one contiguous copy.
func im2colDual[T float32 | float64](p *convPlan, patches, input []T) {
	spatial, kernel, output := p.inputSpatial, p.kernelSpatial, p.outputSpatial
	strides, kernelDilations, inputDilations, lowPads := p.strides, p.kernelDilations, p.inputDilations, p.lowPads
	if len(spatial) == 1 { // One spatial axis: a unit axis in front.
		spatial, kernel, output = []int{1, spatial[0]}, []int{1, kernel[0]}, []int{1, output[0]}
		strides, kernelDilations = []int{1, strides[0]}, []int{1, kernelDilations[0]}
		inputDilations, lowPads = []int{1, inputDilations[0]}, []int{0, lowPads[0]}
	}
	rowTable := positionTable(output[0], kernel[0], spatial[0], strides[0], kernelDilations[0], inputDilations[0], lowPads[0])
	colTable := positionTable(output[1], kernel[1], spatial[1], strides[1], kernelDilations[1], inputDilations[1], lowPads[1])
	// For kernel column kw, the output columns whose input columns are consecutive (stride 1 and no input
	// dilation: all but those reading padding) read one contiguous run of the plane's row: one copy.
	runs := make([][2]int, kernel[1]) // [first, end) output columns of the run
	for kw := range kernel[1] {
		runs[kw] = consecutiveSpan(colTable, output[1], kernel[1], kw)
	}
	batch := p.batch
	planeSize := spatial[0] * spatial[1] * batch
	at := 0
	for c := range p.inChannels {
		plane := input[c*planeSize : (c+1)*planeSize]
		for kh := range kernel[0] {
			for kw := range kernel[1] {
				for oh := range output[0] {
					ih := rowTable[oh*kernel[0]+kh]
					if batch == 1 { // One element per pair: assign instead of calling copy.
						for ow := range output[1] {
							iw := colTable[ow*kernel[1]+kw]
							var v T
							if ih >= 0 && iw >= 0 {
								v = plane[ih*spatial[1]+iw]
							}
							patches[at] = v
							at++
						}
						continue
					}
					if run := runs[kw]; ih >= 0 && run[1] > run[0] {
						first, end := run[0], run[1]
						clear(patches[at : at+first*batch])
						from := (ih*spatial[1] + colTable[first*kernel[1]+kw]) * batch
						n := (end - first) * batch
						copy(patches[at+first*batch:at+first*batch+n], plane[from:from+n])
						clear(patches[at+end*batch : at+output[1]*batch])
						at += output[1] * batch
						continue
					}
					for ow := range output[1] {
						iw := colTable[ow*kernel[1]+kw]
						if ih < 0 || iw < 0 {
							clear(patches[at : at+batch])
						} else {
							from := (ih*spatial[1] + iw) * batch
							copy(patches[at:at+batch], plane[from:from+batch])
						}
						at += batch
					}
				}
			}
		}
	}
}

// smallCopy is the length up to which a loop copies faster than a call to copy.
const smallCopy = 16

// consecutiveRuns returns, for each of outputSize output positions, the first input position its kernel
// positions read if they read kernelSize consecutive input positions (none in padding), else −1.
func consecutiveRuns(table []int, outputSize, kernelSize int) []int {
	firsts := make([]int, outputSize)
	for o := range outputSize {
		positions := table[o*kernelSize : (o+1)*kernelSize]
		firsts[o] = positions[0]
		for k, at := range positions {
			if positions[0] < 0 || at != positions[0]+k {
				firsts[o] = -1
				break
			}
		}
	}
	return firsts
}

// consecutiveSpan returns the output positions [first, end) at which kernel position k reads consecutive
// input positions, with only padding (−1) outside them; first == end when there is no such span (strides,
// input dilations).
func consecutiveSpan(table []int, outputSize, kernelSize, k int) [2]int {
	first, end := -1, -1
	for o := range outputSize {
		at := table[o*kernelSize+k]
		switch {
		case at < 0 && first < 0:
		case at < 0:
			if end < 0 {
				end = o
			}
		case first < 0:
			first = o
		case end >= 0 || at != table[(o-1)*kernelSize+k]+1:
			return [2]int{}
		}
	}
	if first < 0 {
		return [2]int{}
	}
	if end < 0 {
		end = outputSize
	}
	return [2]int{first, end}
}

// seq returns from, from+1, …, from+n−1.
func seq(from, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = from + i
	}
	return s
}

// advance moves a row-major odometer one position forward; false when it wrapped around to all zeros.
func advance(position, sizes []int) bool {
	for i := len(position) - 1; i >= 0; i-- {
		position[i]++
		if position[i] < sizes[i] {
			return true
		}
		position[i] = 0
	}
	return false
}

func product(values []int) int {
	p := 1
	for _, v := range values {
		p *= v
	}
	return p
}

func isPermutation(order []int, rank int) bool {
	if len(order) != rank {
		return false
	}
	seen := make([]bool, rank)
	for _, axis := range order {
		if axis < 0 || axis >= rank || seen[axis] {
			return false
		}
		seen[axis] = true
	}
	return true
}

// nonIdentity returns order, or nil when it is the identity (no copy needed).
func nonIdentity(order []int) []int {
	for i, axis := range order {
		if i != axis {
			return order
		}
	}
	return nil
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
