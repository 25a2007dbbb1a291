package elementwise

import (
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
)

const opTypeSign = backends.OpTypeSign

// execSign computes Sign of float32 and float64 without branches (other dtypes go to simplego's executor).
func execSign(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	shape, err := backend.BufferShape(inputs[0])
	if err != nil || (shape.DType != dtypes.Float32 && shape.DType != dtypes.Float64) {
		return fallbacks[opTypeSign](backend, node, inputs, inputsOwned)
	}
	// Like simplego, write in place when the input buffer is not needed afterwards.
	output := inputs[0]
	if !inputsOwned[0] {
		if output = backend.NewBuffer(shape); output == nil {
			return fallbacks[opTypeSign](backend, node, inputs, inputsOwned)
		}
	}
	in, err1 := backend.BufferData(inputs[0])
	out, err2 := backend.BufferData(output)
	if err1 != nil || err2 != nil {
		return fallbacks[opTypeSign](backend, node, inputs, inputsOwned)
	}
	switch shape.DType {
	case dtypes.Float32:
		signs(in.([]float32), out.([]float32))
	case dtypes.Float64:
		signs(in.([]float64), out.([]float64))
	}
	if output == inputs[0] {
		inputs[0] = nil // Tells simplego the input buffer now lives on as the output, as its own executors do.
	}
	signCalls.Add(1)
	return output, nil
}

// signs writes the sign of each input: (x > 0) − (x < 0) as numbers, so the loop has no data-dependent
// branch. NaN compares false both ways and gives 0, as simplego's branches do.
func signs[T float32 | float64](in, out []T) {
	out = out[:len(in)]
	for i, x := range in {
		out[i] = T(b2i(x > 0) - b2i(x < 0))
	}
}

// b2i is 1 for true and 0 for false; the compiler turns it into a flag set, not a jump.
func b2i(b bool) int {
	var i int
	if b {
		i = 1
	}
	return i
}
