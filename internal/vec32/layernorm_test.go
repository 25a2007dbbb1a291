package vec32

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// layerNormRow is a row of test values: mostly ordinary, with NaN, infinities, signed zeros, large and tiny
// values at random places when special is set.
func layerNormRow(rng *rand.Rand, n int, special bool) []float32 {
	row := make([]float32, n)
	specials := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0,
		float32(math.Copysign(0, -1)), 3e38, -3e38, 1e-40}
	for i := range row {
		row[i] = float32(rng.NormFloat64())
		if special && rng.IntN(16) == 0 {
			row[i] = specials[rng.IntN(len(specials))]
		}
	}
	return row
}

// TestLayerNormPassesMatchTheirCalls holds every row pass, assembly and Go loop, to the element-wise calls
// it stands for, bit for bit: rows of 32 to 256, with and without special values, in place where a pass
// allows it, written nowhere outside its row.
func TestLayerNormPassesMatchTheirCalls(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, n := range []int{32, 64, 128, 256} {
		for _, special := range []bool{false, true} {
			x, dy, gain, offset, residual := layerNormRow(rng, n, special), layerNormRow(rng, n, special),
				layerNormRow(rng, n, special), layerNormRow(rng, n, special), layerNormRow(rng, n, special)
			mean, deviation, scale, shift := float32(0.3), float32(1.7), float32(-0.21), float32(0.05)
			t1, t2, t3 := make([]float32, n), make([]float32, n), make([]float32, n)

			// The calls.
			BinaryScalar(Sub, t1, x, mean)
			Binary(Mul, t2, t1, t1)
			wantSquares := Sum(t2)
			BinaryScalar(Div, t2, t1, deviation)
			wantProduct := make([]float32, n)
			Binary(Mul, wantProduct, dy, t2)
			wantOut := make([]float32, n)
			Binary(Mul, wantOut, t2, gain)
			Binary(Add, wantOut, wantOut, offset)
			g := make([]float32, n)
			Binary(Mul, g, dy, gain)
			BinaryScalar(Div, t2, t1, deviation*deviation)
			Binary(Mul, t2, g, t2)
			Apply(Neg, t2, t2)
			wantDev := Sum(t2)
			BinaryScalar(Div, t3, g, deviation)
			BinaryScalar(Mul, t2, t1, scale)
			Binary(Add, t3, t3, t2)
			Binary(Add, t3, t3, t2)
			wantSum := Sum(t3)
			wantGrad := make([]float32, n)
			BinaryScalar(Add, wantGrad, t3, shift)
			wantGradRes := make([]float32, n)
			Binary(Add, wantGradRes, residual, t3)
			BinaryScalar(Add, wantGradRes, wantGradRes, shift)

			for _, accel := range []bool{true, false} {
				check := func() {
					name := func(pass string) string {
						return pass + map[bool]string{true: " (assembly)", false: " (Go)"}[accel]
					}
					sameBits(t, []float32{wantSquares}, []float32{SquaredDeviationsSum(x, mean)}, "%s n=%d", name("squares"), n)
					sameBits(t, []float32{wantDev}, []float32{LayerNormDeviationGradSum(x, dy, gain, mean, deviation*deviation)},
						"%s n=%d", name("deviation's gradient"), n)
					sameBits(t, []float32{wantSum}, []float32{LayerNormGradSum(x, dy, gain, mean, deviation, scale)},
						"%s n=%d", name("gradient's sum"), n)

					out := newGuarded(n, 3)
					NormalizeAffine(out.dst(), x, gain, offset, mean, deviation)
					sameBits(t, wantOut, out.dst(), "%s n=%d", name("normalised"), n)
					out.check(t, n, true, "%s n=%d", name("normalised"), n)
					inPlace := append([]float32(nil), x...)
					NormalizeAffine(inPlace, inPlace, gain, offset, mean, deviation)
					sameBits(t, wantOut, inPlace, "%s in place, n=%d", name("normalised"), n)

					out = newGuarded(n, 5)
					NormalizedProduct(out.dst(), x, dy, mean, deviation)
					sameBits(t, wantProduct, out.dst(), "%s n=%d", name("product"), n)
					out.check(t, n, true, "%s n=%d", name("product"), n)
					inPlace = append([]float32(nil), dy...)
					NormalizedProduct(inPlace, x, inPlace, mean, deviation)
					sameBits(t, wantProduct, inPlace, "%s in place, n=%d", name("product"), n)

					out = newGuarded(n, 5)
					LayerNormGradOut(out.dst(), x, dy, gain, nil, mean, deviation, scale, shift)
					sameBits(t, wantGrad, out.dst(), "%s n=%d", name("gradient"), n)
					out.check(t, n, true, "%s n=%d", name("gradient"), n)
					inPlace = append([]float32(nil), dy...)
					LayerNormGradOut(inPlace, x, inPlace, gain, nil, mean, deviation, scale, shift)
					sameBits(t, wantGrad, inPlace, "%s in place, n=%d", name("gradient"), n)

					out = newGuarded(n, 5)
					LayerNormGradOut(out.dst(), x, dy, gain, residual, mean, deviation, scale, shift)
					sameBits(t, wantGradRes, out.dst(), "%s with a residual, n=%d", name("gradient"), n)
					out.check(t, n, true, "%s n=%d", name("gradient with a residual"), n)
					inPlace = append([]float32(nil), residual...)
					LayerNormGradOut(inPlace, x, dy, gain, inPlace, mean, deviation, scale, shift)
					sameBits(t, wantGradRes, inPlace, "%s with a residual, in place, n=%d", name("gradient"), n)
				}
				if accel {
					check()
				} else {
					withGo(check)
				}
			}
		}
	}
}

func TestLayerNormPassesRefuseOtherLengths(t *testing.T) {
	for _, n := range []int{0, 1, 31, 33, 100} {
		assert.Equal(t, n > 0 && n%32 == 0, RowPasses(n), "n=%d", n)
		if n == 0 || n%32 != 0 {
			require.Panics(t, func() { SquaredDeviationsSum(make([]float32, n), 0) }, "n=%d", n)
		}
	}
}
