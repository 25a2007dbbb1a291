//go:build mpi

package mpi

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes/bfloat16"
	"github.com/stretchr/testify/require"
	"github.com/x448/float16"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/half"
)

// TestHalfSumsMatchGo: the C reduction operations MPI calls for bfloat16 and fp16 sums give, bit for bit,
// what package half (and so the in-process engine) gives: for every 16-bit value against a spread of
// others, and for random pairs. A NaN may differ in its payload, never in being a NaN.
func TestHalfSumsMatchGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var a, b []uint16
	for x := range 1 << 16 {
		for _, y := range []uint16{0, 1, 0x3c00, 0x3f80, 0x7bff, 0x8001, 0xbc00, 0xfbff, uint16(x) ^ 0x8000, uint16(x), uint16(x + 1)} {
			a, b = append(a, uint16(x)), append(b, y)
		}
	}
	for range 1 << 20 {
		a, b = append(a, uint16(rng.Uint32())), append(b, uint16(rng.Uint32()))
	}
	t.Run("bfloat16", func(t *testing.T) {
		checkHalfSums(t, a, b, half.SumBF16, func(v bfloat16.BFloat16) bool { return math.IsNaN(float64(v.Float32())) })
	})
	t.Run("float16", func(t *testing.T) {
		checkHalfSums(t, a, b, half.SumFP16, float16.Float16.IsNaN)
	})
	err := sumHalves(backends.Float32, backends.BufferOf([]float16.Float16{1}), backends.BufferOf([]float16.Float16{1}))
	require.ErrorContains(t, err, "16-bit sum of float32")
}

func checkHalfSums[T bfloat16.BFloat16 | float16.Float16](t *testing.T, a, b []uint16, sum func(x, y T) T, isNaN func(T) bool) {
	in, inout := make([]T, len(a)), make([]T, len(b))
	for i := range a {
		in[i], inout[i] = T(a[i]), T(b[i])
	}
	bin, binout := backends.BufferOf(in), backends.BufferOf(inout)
	require.NoError(t, sumHalves(bin.Kind, bin, binout))
	for i := range in {
		want := sum(T(a[i]), T(b[i]))
		if got := inout[i]; got != want && !(isNaN(got) && isNaN(want)) {
			t.Fatalf("%s: %#04x + %#04x is %#04x in C, %#04x in Go", bin.Kind, a[i], b[i], uint16(got), uint16(want))
		}
	}
}
