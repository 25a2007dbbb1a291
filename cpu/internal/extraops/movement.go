package extraops

import (
	"fmt"
	"math"
	"slices"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// Pad, Reverse, DynamicSlice and DynamicUpdateSlice: builders (shape checks, static copy plans) and
// executors.

// padParams is a Pad node's data: the copy of the operand into the filled output.
type padParams struct {
	plan copyPlan
	// identity is set when nothing is padded: the output is the operand.
	identity bool
}

// Pad implements backends.Builder: XLA's Pad. On each axis the operand's elements are spaced by Interior
// fill values, then Start and End fill values are added before and after, or, where negative, that many
// elements are cut from that end. Axes beyond len(axesConfig) are not padded. A scalar is returned as is.
func (b *extendedBuilder) Pad(x, fillValue backends.Op, axesConfig ...backends.PadAxis) (backends.Op, error) {
	const opType = backends.OpTypePad
	in, err := b.shapesOf(opType, x, fillValue)
	if err != nil {
		return nil, err
	}
	shape, fillShape := in[0], in[1]
	if !fillShape.IsScalar() || fillShape.DType != shape.DType {
		return nil, fmt.Errorf("%s: fill value %s must be a scalar of the operand's dtype (%s)", opType, fillShape, shape)
	}
	if len(axesConfig) > shape.Rank() {
		return nil, fmt.Errorf("%s: %d axes configured for an operand of rank %d (%s)", opType, len(axesConfig),
			shape.Rank(), shape)
	}
	if shape.IsScalar() {
		return x, nil
	}
	output, params, err := padPlan(shape, axesConfig)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opType, err)
	}
	return b.newNode(opType, output, params, x, fillValue)
}

// padPlan returns the padded shape and the copy of the operand into it.
func padPlan(shape shapes.Shape, axesConfig []backends.PadAxis) (shapes.Shape, *padParams, error) {
	rank := shape.Rank()
	config := make([]backends.PadAxis, rank)
	copy(config, axesConfig)
	outDims := make([]int, rank)
	identity := true
	for a, c := range config {
		d := shape.Dimensions[a]
		if c.Interior < 0 {
			return shapes.Shape{}, nil, fmt.Errorf("negative interior padding %d on axis %d", c.Interior, a)
		}
		outDims[a] = c.Start + c.End + d + max(d-1, 0)*c.Interior
		if outDims[a] < 0 {
			return shapes.Shape{}, nil, fmt.Errorf("padding %+v of axis %d (dimension %d) leaves a negative "+
				"dimension %d", c, a, d, outDims[a])
		}
		identity = identity && c == backends.PadAxis{}
	}
	output := shapes.Make(shape.DType, outDims...)
	inSteps, outSteps := rowMajorSteps(shape.Dimensions), rowMajorSteps(outDims)
	plan := copyPlan{dims: make([]int, rank), srcSteps: inSteps, dstSteps: make([]int, rank)}
	for a, c := range config {
		// Operand index j lands at c.Start + j·spacing: keep the j whose position is inside the output.
		d, spacing, outDim := shape.Dimensions[a], c.Interior+1, outDims[a]
		first := 0
		if c.Start < 0 {
			first = (-c.Start + spacing - 1) / spacing
		}
		last := -1
		if room := outDim - 1 - c.Start; room >= 0 {
			last = min(d-1, room/spacing)
		}
		plan.dims[a] = max(last-first+1, 0)
		plan.srcBase += first * inSteps[a]
		plan.dstBase += (c.Start + first*spacing) * outSteps[a]
		plan.dstSteps[a] = spacing * outSteps[a]
	}
	return output, &padParams{plan: plan, identity: identity}, nil
}

func execPad(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer, inputsOwned []bool) (
	*simplego.Buffer, error) {
	params, ok := nodeData[*padParams](node)
	if !ok || len(inputs) != 2 {
		return nil, errNodeData(backends.OpTypePad)
	}
	if params.identity && inputsOwned[0] {
		operand := inputs[0]
		inputs[0] = nil // Consumed: the output is the operand.
		return operand, nil
	}
	output, flats, err := outputAndData(backend, node, inputs)
	if err != nil {
		return nil, err
	}
	if err := moveWords(flats[0], flats[1], flats[2], 0, params.plan); err != nil {
		_ = backend.BufferFinalize(output)
		return nil, err
	}
	padCalls.Add(1)
	return output, nil
}

// reverseParams is a Reverse node's data: the copy from the operand, read backwards on the reversed axes.
type reverseParams struct{ plan copyPlan }

// Reverse implements backends.Builder: x with the order of its elements reversed along each of axes.
func (b *extendedBuilder) Reverse(x backends.Op, axes ...int) (backends.Op, error) {
	const opType = backends.OpTypeReverse
	in, err := b.shapesOf(opType, x)
	if err != nil {
		return nil, err
	}
	shape := in[0]
	steps := rowMajorSteps(shape.Dimensions)
	plan := copyPlan{dims: slices.Clone(shape.Dimensions), srcSteps: slices.Clone(steps), dstSteps: steps}
	reversed := make([]bool, shape.Rank())
	for _, axis := range axes {
		if axis < 0 || axis >= shape.Rank() || reversed[axis] {
			return nil, fmt.Errorf("%s: axes %v must be distinct axes of %s", opType, axes, shape)
		}
		reversed[axis] = true
		plan.srcBase += (shape.Dimensions[axis] - 1) * steps[axis]
		plan.srcSteps[axis] = -steps[axis]
	}
	return b.newNode(opType, shape.Clone(), &reverseParams{plan: plan}, x)
}

func execReverse(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer, _ []bool) (
	*simplego.Buffer, error) {
	params, ok := nodeData[*reverseParams](node)
	if !ok || len(inputs) != 1 {
		return nil, errNodeData(backends.OpTypeReverse)
	}
	output, flats, err := outputAndData(backend, node, inputs)
	if err != nil {
		return nil, err
	}
	if err := moveWords(flats[0], flats[1], nil, 0, params.plan); err != nil {
		_ = backend.BufferFinalize(output)
		return nil, err
	}
	reverseCalls.Add(1)
	return output, nil
}

// dynamicSliceParams is a DynamicSlice or DynamicUpdateSlice node's data.
type dynamicSliceParams struct {
	// sliceDims are the dimensions of the slice (DynamicSlice) or of the update (DynamicUpdateSlice).
	sliceDims []int
	// firstIndex is the position of the first start index among the node's inputs.
	firstIndex int
	// vector is set when the start indices are one rank-1 tensor rather than one scalar per axis.
	vector bool
}

// checkStartIndices validates DynamicSlice's and DynamicUpdateSlice's start indices against an operand of
// the given rank: one integer scalar per axis, or (as GoMLX's XLA backend also accepts) one integer vector
// of length rank.
func (b *extendedBuilder) checkStartIndices(opType backends.OpType, rank int, startIndices []backends.Op) (
	vector bool, err error) {
	indexShapes, err := b.shapesOf(opType, startIndices...)
	if err != nil {
		return false, err
	}
	for _, s := range indexShapes {
		if !s.DType.IsInt() {
			return false, fmt.Errorf("%s: start index %s is not an integer", opType, s)
		}
	}
	switch {
	case len(indexShapes) == rank && !slices.ContainsFunc(indexShapes, func(s shapes.Shape) bool { return !s.IsScalar() }):
		return false, nil
	case len(indexShapes) == 1 && indexShapes[0].Rank() == 1 && indexShapes[0].Dimensions[0] == rank:
		return true, nil
	}
	return false, fmt.Errorf("%s: start indices %v must be %d integer scalars (or one vector of %d)", opType,
		indexShapes, rank, rank)
}

// DynamicSlice implements backends.Builder: the slice of sliceDims starting at startIndices, each start
// clamped into [0, dimension − slice dimension] as XLA does.
func (b *extendedBuilder) DynamicSlice(operand backends.Op, startIndices []backends.Op, sliceDims []int) (
	backends.Op, error) {
	const opType = backends.OpTypeDynamicSlice
	in, err := b.shapesOf(opType, operand)
	if err != nil {
		return nil, err
	}
	shape := in[0]
	if len(sliceDims) != shape.Rank() {
		return nil, fmt.Errorf("%s: %d slice dimensions for an operand %s", opType, len(sliceDims), shape)
	}
	for a, d := range sliceDims {
		if d < 0 || d > shape.Dimensions[a] {
			return nil, fmt.Errorf("%s: slice dimensions %v do not fit in operand %s", opType, sliceDims, shape)
		}
	}
	vector, err := b.checkStartIndices(opType, shape.Rank(), startIndices)
	if err != nil {
		return nil, err
	}
	params := &dynamicSliceParams{sliceDims: slices.Clone(sliceDims), firstIndex: 1, vector: vector}
	return b.newNode(opType, shapes.Make(shape.DType, sliceDims...), params, append([]backends.Op{operand}, startIndices...)...)
}

// DynamicUpdateSlice implements backends.Builder: operand with update written at startIndices, each start
// clamped into [0, dimension − update dimension] as XLA does.
func (b *extendedBuilder) DynamicUpdateSlice(operand, update backends.Op, startIndices []backends.Op) (
	backends.Op, error) {
	const opType = backends.OpTypeDynamicUpdateSlice
	in, err := b.shapesOf(opType, operand, update)
	if err != nil {
		return nil, err
	}
	shape, updateShape := in[0], in[1]
	if updateShape.DType != shape.DType || updateShape.Rank() != shape.Rank() {
		return nil, fmt.Errorf("%s: update %s does not match operand %s", opType, updateShape, shape)
	}
	for a, d := range updateShape.Dimensions {
		if d > shape.Dimensions[a] {
			return nil, fmt.Errorf("%s: update %s does not fit in operand %s", opType, updateShape, shape)
		}
	}
	vector, err := b.checkStartIndices(opType, shape.Rank(), startIndices)
	if err != nil {
		return nil, err
	}
	params := &dynamicSliceParams{sliceDims: slices.Clone(updateShape.Dimensions), firstIndex: 2, vector: vector}
	return b.newNode(opType, shape.Clone(), params, append([]backends.Op{operand, update}, startIndices...)...)
}

// clampedStarts reads the start indices of a DynamicSlice or DynamicUpdateSlice node and clamps them as XLA
// does, into [0, dims[a] − sliceDims[a]].
func clampedStarts(backend *simplego.Backend, params *dynamicSliceParams, dims []int,
	indices []*simplego.Buffer) ([]int, error) {
	values := make([]int64, 0, len(dims))
	for _, buffer := range indices {
		flat, err := backend.BufferData(buffer)
		if err != nil {
			return nil, err
		}
		if values, err = appendIndices(values, flat); err != nil {
			return nil, err
		}
	}
	if len(values) != len(dims) {
		return nil, fmt.Errorf("%d start indices for %d axes", len(values), len(dims))
	}
	starts := make([]int, len(dims))
	for a, v := range values {
		starts[a] = int(min(max(v, 0), int64(dims[a]-params.sliceDims[a])))
	}
	return starts, nil
}

// appendIndices appends the integers of flat, converted to int64 (unsigned values beyond its range read as
// its maximum: they clamp to the end all the same).
func appendIndices(values []int64, flat any) ([]int64, error) {
	switch f := flat.(type) {
	case []int8:
		return appendConverted(values, f), nil
	case []int16:
		return appendConverted(values, f), nil
	case []int32:
		return appendConverted(values, f), nil
	case []int64:
		return append(values, f...), nil
	case []uint8:
		return appendConverted(values, f), nil
	case []uint16:
		return appendConverted(values, f), nil
	case []uint32:
		return appendConverted(values, f), nil
	case []uint64:
		for _, v := range f {
			values = append(values, int64(min(v, math.MaxInt64)))
		}
		return values, nil
	}
	return nil, fmt.Errorf("start indices of type %T are not integers", flat)
}

func appendConverted[T int8 | int16 | int32 | uint8 | uint16 | uint32](values []int64, flat []T) []int64 {
	for _, v := range flat {
		values = append(values, int64(v))
	}
	return values
}

func execDynamicSlice(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer, _ []bool) (
	*simplego.Buffer, error) {
	params, ok := nodeData[*dynamicSliceParams](node)
	if !ok || len(inputs) < params.firstIndex {
		return nil, errNodeData(backends.OpTypeDynamicSlice)
	}
	operandShape, err := backend.BufferShape(inputs[0])
	if err != nil {
		return nil, err
	}
	starts, err := clampedStarts(backend, params, operandShape.Dimensions, inputs[params.firstIndex:])
	if err != nil {
		return nil, fmt.Errorf("extraops: %s: %w", backends.OpTypeDynamicSlice, err)
	}
	steps := rowMajorSteps(operandShape.Dimensions)
	plan := copyPlan{dims: params.sliceDims, srcSteps: steps, dstSteps: rowMajorSteps(params.sliceDims)}
	for a, start := range starts {
		plan.srcBase += start * steps[a]
	}
	output, flats, err := outputAndData(backend, node, inputs[:1])
	if err != nil {
		return nil, err
	}
	if err := moveWords(flats[0], flats[1], nil, 0, plan); err != nil {
		_ = backend.BufferFinalize(output)
		return nil, err
	}
	dynamicSliceCalls.Add(1)
	return output, nil
}

func execDynamicUpdateSlice(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	params, ok := nodeData[*dynamicSliceParams](node)
	if !ok || len(inputs) < params.firstIndex {
		return nil, errNodeData(backends.OpTypeDynamicUpdateSlice)
	}
	operandShape, err := backend.BufferShape(inputs[0])
	if err != nil {
		return nil, err
	}
	starts, err := clampedStarts(backend, params, operandShape.Dimensions, inputs[params.firstIndex:])
	if err != nil {
		return nil, fmt.Errorf("extraops: %s: %w", backends.OpTypeDynamicUpdateSlice, err)
	}
	steps := rowMajorSteps(operandShape.Dimensions)
	plan := copyPlan{dims: params.sliceDims, srcSteps: rowMajorSteps(params.sliceDims), dstSteps: steps}
	for a, start := range starts {
		plan.dstBase += start * steps[a]
	}
	// The output is the operand, written over in place when this node is its last user.
	var output *simplego.Buffer
	if inputsOwned[0] {
		output = inputs[0]
		inputs[0] = nil // Consumed.
	} else {
		var flats []any
		if output, flats, err = outputAndData(backend, node, inputs[:1]); err != nil {
			return nil, err
		}
		whole := copyPlan{dims: []int{operandShape.Size()}, srcSteps: []int{1}, dstSteps: []int{1}}
		if err := moveWords(flats[0], flats[1], nil, 0, whole); err != nil {
			_ = backend.BufferFinalize(output)
			return nil, err
		}
	}
	outputFlat, err1 := backend.BufferData(output)
	updateFlat, err2 := backend.BufferData(inputs[1])
	if err := errors2(err1, err2); err != nil {
		_ = backend.BufferFinalize(output)
		return nil, err
	}
	if err := moveWords(outputFlat, updateFlat, nil, 0, plan); err != nil {
		_ = backend.BufferFinalize(output)
		return nil, err
	}
	dynamicUpdateSliceCalls.Add(1)
	return output, nil
}

// nodeData returns the node's parameters as T, the type this package's builder stored.
func nodeData[T any](node *simplego.Node) (T, bool) {
	params, ok := nodeDataAny(node).(T)
	return params, ok
}

func errNodeData(opType backends.OpType) error {
	return fmt.Errorf("extraops: %s node without its parameters (not built by extraops' builder)", opType)
}

// outputAndData allocates the node's output buffer and returns it with the flat data of it and of inputs.
func outputAndData(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer) (
	*simplego.Buffer, []any, error) {
	shape, ok := nodeShape(node)
	if !ok {
		return nil, nil, fmt.Errorf("extraops: reading a node's shape (GoMLX internals changed?)")
	}
	output := backend.NewBuffer(shape)
	if output == nil {
		return nil, nil, fmt.Errorf("extraops: backend is finalized")
	}
	flats := make([]any, 1+len(inputs))
	var err error
	if flats[0], err = backend.BufferData(output); err != nil {
		_ = backend.BufferFinalize(output)
		return nil, nil, err
	}
	for i, input := range inputs {
		if flats[1+i], err = backend.BufferData(input); err != nil {
			_ = backend.BufferFinalize(output)
			return nil, nil, err
		}
	}
	return output, flats, nil
}
