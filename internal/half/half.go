// Package half converts between float32 and the two 16-bit float formats gradients travel in, bfloat16 and
// IEEE binary16 (fp16), with IEEE's default rounding (to nearest, ties to even), and adds 16-bit values the
// way goaccel's engines sum them: each pair converted to float32, added there, the sum rounded back once.
//
// GoMLX's own bfloat16.FromFloat32 truncates (rounds toward zero), which biases every rounded gradient
// toward zero; a sum of many rounded values needs unbiased rounding, so bfloat16 is rounded here. The fp16
// conversions are github.com/x448/float16's, checked by its author against all 2^32 float32 inputs. The
// MPI engine's reduction operations (backends/mpi) implement the same rules in C; its tests compare the two.
package half

import (
	"math"

	"github.com/gomlx/gomlx/pkg/core/dtypes/bfloat16"
	"github.com/x448/float16"
)

// BF16 rounds x to the nearest bfloat16, ties to even. NaN stays NaN (quiet, sign kept), and values beyond
// bfloat16's largest finite value (which float32's exponent range shares) round to ±Inf.
func BF16(x float32) bfloat16.BFloat16 {
	bits := math.Float32bits(x)
	if bits&0x7fffffff > 0x7f800000 {
		// NaN: truncating could leave only zero payload bits (an infinity); setting the quiet bit keeps a NaN.
		return bfloat16.BFloat16(bits>>16 | 0x0040)
	}
	// Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry into the exponent is
	// the correct result (up to the next binade, or to infinity).
	return bfloat16.BFloat16((bits + 0x7fff + (bits>>16)&1) >> 16)
}

// FP16 rounds x to the nearest IEEE binary16 value, ties to even: magnitudes from 65520 on become ±Inf,
// and those below 2^-25 become ±0.
func FP16(x float32) float16.Float16 { return float16.Fromfloat32(x) }

// SumBF16 is a + b summed in float32 and rounded to bfloat16 once.
func SumBF16(a, b bfloat16.BFloat16) bfloat16.BFloat16 { return BF16(a.Float32() + b.Float32()) }

// SumFP16 is a + b summed in float32 and rounded to fp16 once.
func SumFP16(a, b float16.Float16) float16.Float16 { return FP16(a.Float32() + b.Float32()) }

// Float is the float types encoded into 16 bits.
type Float interface{ float32 | float64 }

// EncodeBF16 rounds every src[i] into dst[i]; float64 values are first rounded to float32.
func EncodeBF16[F Float](dst []bfloat16.BFloat16, src []F) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = BF16(float32(x))
	}
}

// EncodeFP16 rounds every src[i] into dst[i]; float64 values are first rounded to float32.
func EncodeFP16[F Float](dst []float16.Float16, src []F) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = FP16(float32(x))
	}
}

// DecodeBF16 writes every src[i] into dst[i] (exactly: float32 holds every bfloat16 value).
func DecodeBF16[F Float](dst []F, src []bfloat16.BFloat16) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = F(x.Float32())
	}
}

// DecodeFP16 writes every src[i] into dst[i] (exactly: float32 holds every fp16 value).
func DecodeFP16[F Float](dst []F, src []float16.Float16) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = F(x.Float32())
	}
}
