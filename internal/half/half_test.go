package half

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes/bfloat16"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/x448/float16"
)

// nearestBF16 is the reference rounding: of the two bfloat16 values around x (its truncation and the next
// one up in magnitude), the nearer in exact float64 arithmetic, the one with an even last bit on a tie.
func nearestBF16(x float32) uint16 {
	bits := math.Float32bits(x)
	low := uint16(bits >> 16)
	high := low + 1
	lowErr := math.Abs(float64(x) - float64(math.Float32frombits(uint32(low)<<16)))
	highValue := float64(math.Float32frombits(uint32(high) << 16))
	if math.IsInf(highValue, 0) { // past the largest finite value: rounding treats Inf as 2^128
		highValue = math.Copysign(math.Pow(2, 128), float64(x))
	}
	highErr := math.Abs(float64(x) - highValue)
	switch {
	case lowErr < highErr:
		return low
	case highErr < lowErr:
		return high
	case low&1 == 0:
		return low
	}
	return high
}

func TestBF16RoundsToNearestEven(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(bits uint32) {
		x := math.Float32frombits(bits)
		if math.IsNaN(float64(x)) {
			return
		}
		if got, want := BF16(x).Bits(), nearestBF16(x); got != want {
			t.Fatalf("BF16(%g = %#08x) = %#04x, want %#04x", x, bits, got, want)
		}
	}
	// Every low half-word pattern under a few high ones (ties, carries into the exponent, subnormals,
	// the largest finite values), then random inputs.
	for _, high := range []uint32{0x0000, 0x0001, 0x3f80, 0x3fff, 0x7f7f, 0x8000, 0xbf80, 0xff7f, 0x007f} {
		for low := range uint32(1 << 16) {
			check(high<<16 | low)
		}
	}
	for range 1 << 20 {
		check(rng.Uint32())
	}
}

func TestBF16Specials(t *testing.T) {
	tests := []struct {
		name string
		in   float32
		want float32
	}{
		{"one", 1, 1},
		{"a tie rounds to even (down)", 1 + 1.0/256, 1},
		{"a tie rounds to even (up)", 1 + 3.0/256, 1 + 4.0/256},
		{"just above a tie rounds up", math.Nextafter32(1+1.0/256, 2), 1 + 2.0/256},
		{"the largest float32 rounds to Inf", math.MaxFloat32, float32(math.Inf(1))},
		{"negative zero", float32(math.Copysign(0, -1)), float32(math.Copysign(0, -1))},
		{"-Inf", float32(math.Inf(-1)), float32(math.Inf(-1))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := BF16(tt.in).Float32()
			assert.Equal(t, math.Float32bits(tt.want), math.Float32bits(got), "got %g", got)
		})
	}
	// A NaN whose payload lies only in the low bits would truncate to Inf: it must stay a NaN.
	nan := math.Float32frombits(0x7f800001)
	require.True(t, math.IsNaN(float64(nan)))
	assert.True(t, math.IsNaN(float64(BF16(nan).Float32())))
	assert.True(t, math.IsNaN(float64(BF16(-nan).Float32())))
}

func TestFP16Specials(t *testing.T) {
	tests := []struct {
		in, want float32
	}{
		{65504, 65504},                // largest finite
		{65519, 65504},                // rounds down below the tie
		{65520, float32(math.Inf(1))}, // the tie rounds to even: Inf
		{1 + 1.0/2048, 1},             // a tie rounds to even (down)
		{1 + 3.0/2048, 1 + 4.0/2048},  // a tie rounds to even (up)
		{0x1p-24, 0x1p-24},            // smallest subnormal
		{0x1p-25, 0},                  // a tie with zero rounds to zero
		{0x1.8p-25, 0x1p-24},          // above the tie rounds up
		{float32(math.Inf(-1)), float32(math.Inf(-1))},
	}
	for _, tt := range tests {
		got := FP16(tt.in).Float32()
		assert.Equal(t, tt.want, got, "FP16(%g)", tt.in)
	}
	assert.True(t, math.IsNaN(float64(FP16(float32(math.NaN())).Float32())))
}

func TestSumsRoundOnce(t *testing.T) {
	// 1 + 2^-8 is a bfloat16 tie: the float32 sum is exact, then rounds to even (1). Two such additions in
	// bfloat16 arithmetic would lose both; one rounding of the float32 sum of 2^-8 + 2^-8 keeps 2^-7.
	one, tiny := BF16(1), BF16(0x1p-8)
	assert.Equal(t, float32(1), SumBF16(one, tiny).Float32())
	assert.Equal(t, float32(0x1p-7), SumBF16(tiny, tiny).Float32())
	assert.Equal(t, float32(1+0x1p-7), SumBF16(one, SumBF16(tiny, tiny)).Float32())
	// Summing is commutative bit for bit, which is what lets every rank of a reduction agree.
	rng := rand.New(rand.NewPCG(3, 4))
	for range 1 << 16 {
		a, b := bfloat16.BFloat16(rng.Uint32()), bfloat16.BFloat16(rng.Uint32())
		if x, y := SumBF16(a, b), SumBF16(b, a); x != y && !math.IsNaN(float64(x.Float32())) {
			t.Fatalf("SumBF16(%v, %v) = %v but SumBF16(%v, %v) = %v", a, b, x, b, a, y)
		}
		c, d := float16.Float16(rng.Uint32()), float16.Float16(rng.Uint32())
		if x, y := SumFP16(c, d), SumFP16(d, c); x != y && !x.IsNaN() {
			t.Fatalf("SumFP16(%v, %v) = %v but SumFP16(%v, %v) = %v", c, d, x, d, c, y)
		}
	}
	assert.Equal(t, float32(65504), SumFP16(FP16(65000), FP16(504)).Float32())
	assert.True(t, math.IsInf(float64(SumFP16(FP16(65504), FP16(32)).Float32()), 1), "fp16 sums overflow to Inf")
}

func TestEncodeDecode(t *testing.T) {
	src := []float64{1, -2.5, 1 + 0x1p-9, math.Inf(1), 1e-30}
	bf := make([]bfloat16.BFloat16, len(src))
	EncodeBF16(bf, src)
	back := make([]float64, len(src))
	DecodeBF16(back, bf)
	assert.Equal(t, []float64{1, -2.5, 1, math.Inf(1), float64(BF16(1e-30).Float32())}, back)

	fp := make([]float16.Float16, len(src))
	EncodeFP16(fp, src)
	back32 := make([]float32, len(src))
	DecodeFP16(back32, fp)
	assert.Equal(t, []float32{1, -2.5, 1 + 0x1p-9, float32(math.Inf(1)), 0}, back32)
}
