package elementwise

import (
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

var convertCalls atomicCounter

// execConvertDType converts booleans to float32 or float64 in a plain loop (comparisons become masks this
// way, as in the gradients of Max and Min), and bytes to them through a table (images arrive as uint8 pixels,
// converted once per batch: simplego's generic loop takes twice a plain loop's time, three times a table's);
// other conversions go to simplego's executor.
func execConvertDType(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	if output, ok := runConvertToFloat(backend, node, inputs); ok {
		convertCalls.Add(1)
		return output, nil
	}
	return fallbacks[opTypeConvertDType](backend, node, inputs, inputsOwned)
}

func runConvertToFloat(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer) (*simplego.Buffer, bool) {
	shape, ok := gomlxpatch.NodeShape(node)
	if !ok || len(inputs) != 1 || (shape.DType != dtypes.Float32 && shape.DType != dtypes.Float64) {
		return nil, false
	}
	inShape, err := backend.BufferShape(inputs[0])
	if err != nil || (inShape.DType != dtypes.Bool && inShape.DType != dtypes.Uint8) || inShape.Size() != shape.Size() {
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
	switch in := in.(type) {
	case []bool:
		switch out := out.(type) {
		case []float32:
			fromBool(in, out)
		case []float64:
			fromBool(in, out)
		}
	case []uint8:
		switch out := out.(type) {
		case []float32:
			fromByte(in, out, &byteFloat32)
		case []float64:
			fromByte(in, out, &byteFloat64)
		}
	}
	return output, true
}

// byteFloat32 and byteFloat64 are every byte's value, exactly (float32 holds integers up to 2²⁴).
var byteFloat32, byteFloat64 = byteTable[float32](), byteTable[float64]()

func byteTable[T float32 | float64]() (t [256]T) {
	for i := range t {
		t[i] = T(i)
	}
	return t
}

// fromByte converts bytes through table, eight at a time: one load from the first-level cache per element
// instead of a conversion instruction's latency.
func fromByte[T float32 | float64](in []uint8, out []T, table *[256]T) {
	out = out[:len(in)]
	i := 0
	for ; i+8 <= len(in); i += 8 {
		s, d := in[i:i+8:i+8], out[i:i+8:i+8]
		d[0], d[1], d[2], d[3] = table[s[0]], table[s[1]], table[s[2]], table[s[3]]
		d[4], d[5], d[6], d[7] = table[s[4]], table[s[5]], table[s[6]], table[s[7]]
	}
	for ; i < len(in); i++ {
		out[i] = table[in[i]]
	}
}

func fromBool[T float32 | float64](in []bool, out []T) {
	out = out[:len(in)]
	for i, b := range in {
		out[i] = T(b2i(b))
	}
}
