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

					// Each writing pass, into a guarded row and in place over the input it may overwrite.
					for _, w := range []struct {
						pass    string
						want    []float32
						aliased []float32 // the input the output may be
						run     func(dst, aliased []float32)
					}{
						{"normalised", wantOut, x, func(dst, in []float32) {
							NormalizeAffine(dst, in, gain, offset, mean, deviation)
						}},
						{"product", wantProduct, dy, func(dst, in []float32) {
							NormalizedProduct(dst, x, in, mean, deviation)
						}},
						{"gradient", wantGrad, dy, func(dst, in []float32) {
							LayerNormGradOut(dst, x, in, gain, nil, mean, deviation, scale, shift)
						}},
						{"gradient with a residual", wantGradRes, residual, func(dst, in []float32) {
							LayerNormGradOut(dst, x, dy, gain, in, mean, deviation, scale, shift)
						}},
					} {
						out := newGuarded(n, 5)
						w.run(out.dst(), w.aliased)
						sameBits(t, w.want, out.dst(), "%s n=%d", name(w.pass), n)
						out.check(t, n, true, "%s n=%d", name(w.pass), n)
						inPlace := append([]float32(nil), w.aliased...)
						w.run(inPlace, inPlace)
						sameBits(t, w.want, inPlace, "%s in place, n=%d", name(w.pass), n)
					}
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
