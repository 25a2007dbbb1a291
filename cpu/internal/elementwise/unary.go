package elementwise

import (
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"

	"github.com/goaccel/goaccel/internal/vec32"
)

// Exp (softmax, cross-entropy) and Erf (the exact GELU) in float32: simplego computes each element in
// float64 through Go's math package, which the transformer's profile showed as a fifth of its step. Here
// they are computed in float32 by vec32 (its Exp and Erf say how, and how close). float64 stays with
// simplego.

var expCalls, erfCalls atomicCounter

// unaryFloat32 runs fn over a float32 input, in place when the executor owns it (as simplego does); ok is
// false for other dtypes.
func unaryFloat32(backend *simplego.Backend, inputs []*simplego.Buffer, inputsOwned []bool,
	fn func(in, out []float32)) (*simplego.Buffer, bool) {
	if len(inputs) != 1 {
		return nil, false
	}
	shape, err := backend.BufferShape(inputs[0])
	if err != nil || shape.DType != dtypes.Float32 {
		return nil, false
	}
	output := inputs[0]
	if !inputsOwned[0] {
		if output = backend.NewBuffer(shape); output == nil {
			return nil, false
		}
	}
	in, err1 := backend.BufferData(inputs[0])
	out, err2 := backend.BufferData(output)
	if err1 != nil || err2 != nil {
		if output != inputs[0] {
			_ = backend.BufferFinalize(output)
		}
		return nil, false
	}
	fn(in.([]float32), out.([]float32))
	if output == inputs[0] {
		inputs[0] = nil // simplego's signal that the input buffer lives on as the output.
	}
	return output, true
}

func execExp(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	if output, ok := unaryFloat32(backend, inputs, inputsOwned, exps); ok {
		expCalls.Add(1)
		return output, nil
	}
	return fallbacks[backends.OpTypeExp](backend, node, inputs, inputsOwned)
}

func execErf(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	if output, ok := unaryFloat32(backend, inputs, inputsOwned, erfs); ok {
		erfCalls.Add(1)
		return output, nil
	}
	return fallbacks[backends.OpTypeErf](backend, node, inputs, inputsOwned)
}

func exps(in, out []float32) { vec32.Apply(vec32.Exp, out, in) }

func erfs(in, out []float32) { vec32.Apply(vec32.Erf, out, in) }
