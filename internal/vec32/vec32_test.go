package vec32

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// specials are values every kernel must treat as Go does.
var specials = []float32{0, float32(math.Copysign(0, -1)), 1, -1, float32(math.NaN()), float32(math.Inf(1)),
	float32(math.Inf(-1)), math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 1e-40, -88, -90,
	-100, -104.5, 88.7, 88.8, 3.99, 4.01, -4.5}

// inputs returns n values: random magnitudes across float32's range, specials, and repeated values (so
// that Equal and the max/min tie rules are exercised).
func inputs(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch rng.IntN(4) {
		case 0:
			x[i] = specials[rng.IntN(len(specials))]
		case 1:
			x[i] = float32(rng.NormFloat64() * 10)
		case 2:
			x[i] = float32(rng.IntN(3) - 1)
		default:
			x[i] = float32(math.Ldexp(rng.Float64()*2-1, rng.IntN(60)-30))
		}
	}
	return x
}

// sameBits reports whether got and want hold the same values: bitwise, except that any NaN matches any NaN.
func sameBits(t *testing.T, want, got []float32, format string, args ...any) {
	t.Helper()
	for i := range want {
		w, g := want[i], got[i]
		if w != w && g != g {
			continue
		}
		if math.Float32bits(w) != math.Float32bits(g) {
			assert.Failf(t, "values differ", "%s: element %d: want %g (%#x), got %g (%#x)", fmt.Sprintf(format, args...),
				i, w, math.Float32bits(w), g, math.Float32bits(g))
			return
		}
	}
}

// withGo runs fn with the assembly switched off.
func withGo(fn func()) {
	saved := accelerated
	accelerated = false
	defer func() { accelerated = saved }()
	fn()
}

// lengths cover the unrolled loop, the single-vector loop and the Go tail, at offsets that misalign the
// slices.
var lengths = []int{0, 1, 7, 8, 9, 31, 32, 33, 63, 100, 257, 280, 1000}

func TestAccelerated(t *testing.T) {
	if !accelerated {
		t.Skip("this machine has no AVX2: only the Go loops run (and are tested below against themselves)")
	}
	assert.True(t, Accelerated())
}

// eachWidth runs test with the AVX2 kernels only and, where the processor has AVX-512, with its kernels.
func eachWidth(t *testing.T, test func(t *testing.T)) {
	hasWide := wide
	t.Cleanup(func() { wide = hasWide })
	for _, width := range []struct {
		name string
		wide bool
	}{{"AVX2", false}, {"AVX-512", true}} {
		t.Run(width.name, func(t *testing.T) {
			if width.wide && !hasWide {
				t.Skip("no AVX-512 on this machine")
			}
			wide = width.wide
			test(t)
		})
	}
}

// TestKernelsMatchGo holds every assembly kernel to the Go loop bit for bit, for every length and
// misalignment, in place and not: the AVX2 kernels, and the AVX-512 ones where they run.
func TestKernelsMatchGo(t *testing.T) {
	if !accelerated {
		t.Skip("no AVX2 on this machine: there is no assembly to compare")
	}
	eachWidth(t, testKernelsMatchGo)
}

func testKernelsMatchGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range lengths {
		for _, offset := range []int{0, 1, 3} {
			a, b, c := inputs(rng, n+offset)[offset:], inputs(rng, n+offset)[offset:], inputs(rng, n+offset)[offset:]
			s := specials[rng.IntN(len(specials))]
			check := func(name string, run func(dst []float32)) {
				want, got := make([]float32, n), make([]float32, n)
				withGo(func() { run(want) })
				run(got)
				sameBits(t, want, got, "%s n=%d offset=%d", name, n, offset)
			}
			for op := range numOps {
				check(fmt.Sprintf("Binary(%s)", op), func(dst []float32) { Binary(op, dst, a, b) })
				check(fmt.Sprintf("BinaryScalar(%s, %g)", op, s), func(dst []float32) { BinaryScalar(op, dst, a, s) })
				check(fmt.Sprintf("ScalarBinary(%g, %s)", s, op), func(dst []float32) { ScalarBinary(op, dst, s, a) })
				check(fmt.Sprintf("Binary(%s) in place", op), func(dst []float32) {
					copy(dst, a)
					Binary(op, dst, dst, b)
				})
			}
			for u := range numUnary {
				check(u.String(), func(dst []float32) { Apply(u, dst, a) })
				check(u.String()+" in place", func(dst []float32) {
					copy(dst, a)
					Apply(u, dst, dst)
				})
			}
			cond := make([]float32, n)
			for i := range cond {
				cond[i] = float32(rng.IntN(2))
			}
			check("Select", func(dst []float32) { Select(dst, cond, b, c) })
			bools := make([]bool, n)
			for i := range bools {
				bools[i] = rng.IntN(2) == 0
			}
			check("FromBool", func(dst []float32) { FromBool(dst, bools) })
			check("Fill", func(dst []float32) { Fill(dst, s) })
			d, e, f := inputs(rng, n), inputs(rng, n), inputs(rng, n)
			// The two-accumulator kernels: each accumulator checked on its own.
			check("AddShiftedMoments sum", func(dst []float32) { copy(dst, d); AddShiftedMoments(dst, slices.Clone(c[:n]), a, b) })
			check("AddShiftedMoments squares", func(dst []float32) { copy(dst, c); AddShiftedMoments(slices.Clone(d[:n]), dst, a, b) })
			check("AddGradientMoments sum", func(dst []float32) { copy(dst, d); AddGradientMoments(dst, slices.Clone(c[:n]), a, b, e) })
			check("AddGradientMoments products", func(dst []float32) { copy(dst, c); AddGradientMoments(slices.Clone(d[:n]), dst, a, b, e) })
			check("ScaleDeviations", func(dst []float32) { ScaleDeviations(dst, a, b, c, d) })
			check("CombineDeviations", func(dst []float32) { CombineDeviations(dst, a, b, c, d, e, f) })
		}
	}
}

// TestGoSemantics checks the Go loops themselves on the cases the operations are defined by.
func TestGoSemantics(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	nan := float32(math.NaN())
	for _, accel := range []bool{false, true} {
		if accel && !accelerated {
			continue
		}
		run := func(fn func()) {
			if accel {
				fn()
			} else {
				withGo(fn)
			}
		}
		// Eight copies, so that the assembly (when present) computes them.
		fill := func(v float32) []float32 {
			x := make([]float32, 8)
			for i := range x {
				x[i] = v
			}
			return x
		}
		tests := []struct {
			op   Op
			a, b float32
			want float32
		}{
			{Max, negZero, 0, 0}, {Max, 0, negZero, 0}, {Min, negZero, 0, negZero}, {Min, 0, negZero, negZero},
			{Max, nan, 1, nan}, {Max, 1, nan, nan}, {Min, nan, 1, nan}, {Min, 1, nan, nan},
			{Max, 2, 3, 3}, {Min, 2, 3, 2},
			{Equal, nan, nan, 0}, {NotEqual, nan, nan, 1}, {LessThan, nan, 1, 0}, {GreaterOrEqual, 1, nan, 0},
			{GreaterOrEqual, 1, 1, 1}, {GreaterThan, 1, 1, 0}, {LessOrEqual, negZero, 0, 1},
		}
		for _, tt := range tests {
			dst := make([]float32, 8)
			run(func() { Binary(tt.op, dst, fill(tt.a), fill(tt.b)) })
			sameBits(t, fill(tt.want), dst, "accelerated=%v: %g %s %g", accel, tt.a, tt.op, tt.b)
		}
		dst := make([]float32, 8)
		run(func() { ScalarBinary(Sub, dst, 10, fill(3)) })
		assert.Equal(t, fill(7), dst, "s − a")
		run(func() { ScalarBinary(Div, dst, 1, fill(4)) })
		assert.Equal(t, fill(0.25), dst, "s / a")
		run(func() { ScalarBinary(LessThan, dst, 1, fill(4)) })
		assert.Equal(t, fill(1), dst, "s < a")
		run(func() { Apply(Neg, dst, fill(0)) })
		sameBits(t, fill(negZero), dst, "−0")
		run(func() { Apply(Abs, dst, fill(-2)) })
		assert.Equal(t, fill(2), dst)
		run(func() { Apply(Abs, dst, fill(negZero)) })
		sameBits(t, fill(negZero), dst, "Abs(−0) is −0, as in GoMLX's pure-Go backend")
		run(func() { FromBool(dst, []bool{true, false, true, true, false, false, true, false}) })
		assert.Equal(t, []float32{1, 0, 1, 1, 0, 0, 1, 0}, dst)
		run(func() { Select(dst, []float32{1, 0, 1, 0, 1, 0, 1, 0}, fill(5), fill(6)) })
		assert.Equal(t, []float32{5, 6, 5, 6, 5, 6, 5, 6}, dst)
	}
}

func TestSwapped(t *testing.T) {
	for op := range numOps {
		swapped, ok := op.Swapped()
		if op == Sub || op == Div {
			assert.False(t, ok, "%s", op)
			continue
		}
		require.True(t, ok, "%s", op)
		a, b := inputs(rand.New(rand.NewPCG(3, uint64(op))), 64), inputs(rand.New(rand.NewPCG(4, uint64(op))), 64)
		want, got := make([]float32, 64), make([]float32, 64)
		Binary(op, want, a, b)
		Binary(swapped, got, b, a)
		sameBits(t, want, got, "%s swapped to %s", op, swapped)
	}
}

// TestExp bounds Exp against Go's float64 exp over float32's whole range, special values included, through
// both the assembly and the Go loop.
func TestExp(t *testing.T) {
	assert.True(t, math.IsNaN(float64(Exp32(float32(math.NaN())))))
	assert.Equal(t, float32(math.Inf(1)), Exp32(float32(math.Inf(1))))
	assert.Equal(t, float32(0), Exp32(float32(math.Inf(-1))))
	assert.Equal(t, float32(math.Inf(1)), Exp32(89))
	assert.Equal(t, float32(1), Exp32(0))
	var xs []float32
	for x := float32(-104); x < 89; x += 0.000731 {
		xs = append(xs, x)
	}
	got := make([]float32, len(xs))
	Apply(Exp, got, xs)
	worst := 0.0
	for i, x := range xs {
		want := math.Exp(float64(x))
		if math.IsInf(float64(float32(want)), 1) {
			assert.True(t, math.IsInf(float64(got[i]), 1), "x=%g overflows float32", x)
			continue
		}
		if want < 1.2e-38 { // Subnormal results are computed exactly: compare absolutely.
			assert.InDelta(t, want, float64(got[i]), 1.5e-45, "x=%g", x)
			continue
		}
		worst = max(worst, math.Abs(float64(got[i])-want)/want)
	}
	assert.Less(t, worst, 2e-7, "relative error (float32's epsilon is 1.19e-7)")
	t.Logf("worst relative error %.3g", worst)
}

// TestExpErfEveryValue holds Exp and Erf to the Go loops bit for bit over every float32 of their
// interesting ranges, one in 613, and the specials: the AVX2 kernels and the AVX-512 ones.
func TestExpErfEveryValue(t *testing.T) {
	if !accelerated {
		t.Skip("no AVX2 on this machine: there is no assembly to compare")
	}
	var xs []float32
	for bits := math.Float32bits(-110); bits > math.Float32bits(-1e-30); bits -= 613 {
		xs = append(xs, math.Float32frombits(bits))
	}
	for bits := uint32(0); math.Float32frombits(bits) < 90; bits += 613 {
		xs = append(xs, math.Float32frombits(bits))
	}
	xs = append(xs, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.Copysign(0, -1)))
	eachWidth(t, func(t *testing.T) {
		for _, u := range []Unary{Exp, Erf} {
			want, got := make([]float32, len(xs)), make([]float32, len(xs))
			withGo(func() { Apply(u, want, xs) })
			Apply(u, got, xs)
			sameBits(t, want, got, "%s over %d values", u, len(xs))
		}
	})
}

// TestExpSubnormalInPlace: the assembly leaves subnormal lanes for the Go side, which must find them also
// when the input was overwritten.
func TestExpSubnormalInPlace(t *testing.T) {
	eachWidth(t, testExpSubnormalInPlace)
}

func testExpSubnormalInPlace(t *testing.T) {
	values := []float32{-90, -95, 0, 1, -100, -103.9, -88, 2, -104.5, -87.34, 3, 4, 5, 6, 7, 8}
	var x []float32
	for range 20 { // past wideFrom, so that the AVX-512 kernel meets them too
		x = append(x, values...)
	}
	want := make([]float32, len(x))
	for i, v := range x {
		want[i] = float32(math.Exp(float64(v)))
	}
	notInPlace := make([]float32, len(x))
	Apply(Exp, notInPlace, x)
	inPlace := append([]float32(nil), x...)
	Apply(Exp, inPlace, inPlace)
	for i := range x {
		assert.InDelta(t, want[i], notInPlace[i], float64(want[i])*2e-7+1.5e-45, "x=%g", x[i])
		assert.Equal(t, notInPlace[i], inPlace[i], "x=%g in place", x[i])
	}
}

// TestErf bounds Erf against Go's float64 erf.
func TestErf(t *testing.T) {
	assert.True(t, math.IsNaN(float64(Erf32(float32(math.NaN())))))
	assert.Equal(t, float32(1), Erf32(float32(math.Inf(1))))
	assert.Equal(t, float32(-1), Erf32(float32(math.Inf(-1))))
	assert.Equal(t, float32(0), Erf32(0))
	var xs []float32
	for x := float32(-7); x < 7; x += 0.0001 {
		xs = append(xs, x)
	}
	got := make([]float32, len(xs))
	Apply(Erf, got, xs)
	worst := 0.0
	for i, x := range xs {
		worst = max(worst, math.Abs(float64(got[i])-math.Erf(float64(x))))
	}
	assert.Less(t, worst, 5e-7)
	t.Logf("worst absolute error %.3g", worst)
}

// BenchmarkKernels times the assembly against the Go loops on a tensor that fits the L2 cache.
func BenchmarkKernels(b *testing.B) {
	const n = 1 << 16
	rng := rand.New(rand.NewPCG(5, 6))
	x, y, dst := inputs(rng, n), inputs(rng, n), make([]float32, n)
	// A causal softmax's shifted scores, half of them masked to float32's lowest value (row i/64 of a 64×64
	// score matrix sees positions up to its own), and GELU's spread values.
	softmaxScores, spread := make([]float32, n), make([]float32, n)
	for i := range softmaxScores {
		softmaxScores[i] = -float32(i%61) / 10
		if (i/64)%64 < i%64 {
			softmaxScores[i] = -math.MaxFloat32
		}
		spread[i] = float32(i%2003)/100 - 10
	}
	cases := []struct {
		name string
		run  func()
	}{
		{"Mul", func() { Binary(Mul, dst, x, y) }},
		{"MaxScalar", func() { BinaryScalar(Max, dst, x, 0) }},
		{"GreaterOrEqual", func() { Binary(GreaterOrEqual, dst, x, y) }},
		{"Select", func() { Select(dst, x, y, x) }},
		{"Exp/causal-softmax", func() { Apply(Exp, dst, softmaxScores) }},
		{"Exp/spread", func() { Apply(Exp, dst, spread) }},
		{"Erf", func() { Apply(Erf, dst, x) }},
	}
	hasWide := wide
	defer func() { wide = hasWide }()
	for _, c := range cases {
		for _, kernel := range []string{"go", "avx2", "avx512"} {
			if (kernel == "avx2" && !accelerated) || (kernel == "avx512" && !hasWide) {
				continue
			}
			b.Run(c.name+"/"+kernel, func(b *testing.B) {
				b.SetBytes(4 * n)
				wide = kernel == "avx512"
				if kernel != "go" {
					for b.Loop() {
						c.run()
					}
					return
				}
				withGo(func() {
					for b.Loop() {
						c.run()
					}
				})
			})
		}
	}
}

// TestReductions holds the assembly's folds to the Go loops bit for bit (NaN matching NaN), checks Sum
// against float64 sums (it is more accurate than one running sum), and MaxOf/MinOf against Go's max/min
// folded one by one.
func TestReductions(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{0, 1, 31, 32, 33, 64, 100, 1000, 4099} {
		x := inputs(rng, n)
		finite := make([]float32, n)
		for i := range finite {
			finite[i] = float32(rng.NormFloat64())
		}
		var got, want [3]float32
		run := func(out *[3]float32) {
			out[0], out[1], out[2] = Sum(finite), MaxOf(x, -math.MaxFloat32), MinOf(x, math.MaxFloat32)
		}
		run(&got)
		withGo(func() { run(&want) })
		sameBits(t, want[:], got[:], "n=%d: assembly against Go", n)
		squares := SumSquares(finite)
		var squaresGo, exactSquares float64
		withGo(func() { squaresGo = SumSquares(finite) })
		assert.Equal(t, squaresGo, squares, "n=%d: SumSquares, assembly against Go", n)
		for _, v := range finite {
			exactSquares += float64(v) * float64(v)
		}
		assert.InDelta(t, exactSquares, squares, 1e-12*float64(n+1), "n=%d: SumSquares", n)

		var exact float64
		for _, v := range finite {
			exact += float64(v)
		}
		assert.InDelta(t, exact, float64(got[0]), 1e-6*float64(n+1), "n=%d: Sum", n)
		maxOne, minOne := float32(-math.MaxFloat32), float32(math.MaxFloat32)
		for _, v := range x {
			maxOne, minOne = max(maxOne, v), min(minOne, v)
		}
		sameBits(t, []float32{maxOne, minOne}, got[1:], "n=%d: MaxOf and MinOf against one running value", n)
	}
}

// TestCombineIsPairwise checks the written-out combines against the pairwise fold they stand for (l with
// l+16, then l+8, l+4, l+2, l+1), bit for bit (a NaN as a NaN), on values that include NaN, infinities and
// signed zeros.
func TestCombineIsPairwise(t *testing.T) {
	pairwise := func(acc [lanes]float32, op func(a, b float32) float32) float32 {
		for width := lanes / 2; width >= 1; width /= 2 {
			for l := range width {
				acc[l] = op(acc[l], acc[l+width])
			}
		}
		return acc[0]
	}
	special := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0,
		float32(math.Copysign(0, -1)), 1e-38, -3.3e38}
	rng := rand.New(rand.NewPCG(11, 12))
	for trial := range 2000 {
		var acc [lanes]float32
		for l := range acc {
			acc[l] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(9)-4)))
			if trial%3 == 0 && rng.IntN(8) == 0 {
				acc[l] = special[rng.IntN(len(special))]
			}
		}
		for _, tc := range []struct {
			name    string
			combine func(*[lanes]float32) float32
			op      func(a, b float32) float32
		}{
			{"sum", combineSum, func(a, b float32) float32 { return a + b }},
			{"max", combineMax, func(a, b float32) float32 { return max(a, b) }},
			{"min", combineMin, func(a, b float32) float32 { return min(a, b) }},
			// The assembly's, where it runs (else these are the Go ones again).
			{"sum (assembly)", func(a *[lanes]float32) float32 { return combine(foldSum, a) }, func(a, b float32) float32 { return a + b }},
			{"max (assembly)", func(a *[lanes]float32) float32 { return combine(foldMax, a) }, func(a, b float32) float32 { return max(a, b) }},
			{"min (assembly)", func(a *[lanes]float32) float32 { return combine(foldMin, a) }, func(a, b float32) float32 { return min(a, b) }},
		} {
			input := acc
			got, want := tc.combine(&input), pairwise(acc, tc.op)
			if want != want { // NaN: which operand's payload survives an addition is the processor's choice
				require.True(t, got != got, "%s of %v: %v, want NaN", tc.name, acc, got)
				continue
			}
			require.Equal(t, math.Float32bits(want), math.Float32bits(got), "%s of %v", tc.name, acc)
			for l := range acc {
				require.Equal(t, math.Float32bits(acc[l]), math.Float32bits(input[l]), "%s changed its input", tc.name)
			}
		}
	}
}
