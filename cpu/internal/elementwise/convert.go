package elementwise

import (
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

var convertCalls atomicCounter

// execConvertDType converts booleans to float32 or float64 in a plain loop (comparisons become masks this
// way, as in the gradients of Max and Min); other conversions go to simplego's executor.
func execConvertDType(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	if output, ok := runConvertFromBool(backend, node, inputs); ok {
		convertCalls.Add(1)
		return output, nil
	}
	return fallbacks[opTypeConvertDType](backend, node, inputs, inputsOwned)
}

func runConvertFromBool(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer) (*simplego.Buffer, bool) {
	shape, ok := gomlxpatch.NodeShape(node)
	if !ok || len(inputs) != 1 || (shape.DType != dtypes.Float32 && shape.DType != dtypes.Float64) {
		return nil, false
	}
	inShape, err := backend.BufferShape(inputs[0])
	if err != nil || inShape.DType != dtypes.Bool || inShape.Size() != shape.Size() {
		return nil, false
	}
	output := backend.NewBuffer(shape)
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
		fromBool(in.([]bool), out.([]float32))
	case dtypes.Float64:
		fromBool(in.([]bool), out.([]float64))
	}
	return output, true
}

func fromBool[T float32 | float64](in []bool, out []T) {
	out = out[:len(in)]
	for i, b := range in {
		out[i] = T(b2i(b))
	}
}
