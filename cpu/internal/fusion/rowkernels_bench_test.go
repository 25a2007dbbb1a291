package fusion

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkLayerNormRows compares a layer norm's row kernels over a transformer's activations ([2048, 128])
// one element-wise call per operation and in vec32's row passes (the same bits).
func BenchmarkLayerNormRows(b *testing.B) {
	const rows, n = 2048, 128
	rng := rand.New(rand.NewPCG(1, 2))
	x, y, dy := make([]float32, rows*n), make([]float32, rows*n), make([]float32, rows*n)
	gain, offset := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i], dy[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	for i := range gain {
		gain[i], offset[i] = float32(0.5+rng.Float64()), float32(rng.NormFloat64())
	}
	scratch := make([]float32, 4*n)
	k := &layerNormGradConstants{invN: 1.0 / n, epsilon: 1e-5, one: 1, half: 0.5, invNDeviation: 1.0 / n,
		invNMean: 1.0 / n}
	row := func(v []float32, r int) []float32 { return v[r*n : (r+1)*n] }
	for _, tc := range []struct {
		name string
		run  func(r int)
	}{
		{"forward/calls", func(r int) { layerNormRowCalls(row(y, r), row(x, r), gain, offset, k.invN, k.epsilon, scratch[:n]) }},
		{"forward/passes", func(r int) { layerNormRow(row(y, r), row(x, r), gain, offset, k.invN, k.epsilon, scratch[:n]) }},
		{"gradient/calls", func(r int) { layerNormGradRowCalls(row(y, r), row(x, r), gain, row(dy, r), nil, k, scratch) }},
		{"gradient/passes", func(r int) { layerNormGradRow(row(y, r), row(x, r), gain, row(dy, r), nil, k, scratch) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				for r := range rows {
					tc.run(r)
				}
			}
		})
	}
}
