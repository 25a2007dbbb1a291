package main

import (
	"math"

	"github.com/gomlx/gomlx/pkg/core/tensors"
)

// The sine task: from -steps samples of a sine of random frequency and phase, predict the next sample.
// Predicting 0 scores a mean squared error of about 0.5, repeating the last sample about 0.1 (with 8 steps);
// an LSTM learns to continue the sine far better.

// splitMix64 is the SplitMix64 generator (Steele, Lea and Flood, 2014): a few lines that any language
// reproduces bit for bit, so that internal/bench/pytorch/lstm_sine.py draws the same data from the same
// seed.
type splitMix64 struct{ state uint64 }

func (s *splitMix64) next() uint64 {
	s.state += 0x9e3779b97f4a7c15
	z := s.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// float64 is uniform in [0, 1), from the top 53 bits.
func (s *splitMix64) float64() float64 { return float64(s.next()>>11) / (1 << 53) }

// sineData returns n sequences [n, steps, 1] of sin(w·t + φ) at t = 0 … steps−1, w uniform in [0.3, 0.8)
// and φ in [0, 2π), and their next samples sin(w·steps + φ) [n, 1]: sequence i draws w, then φ, from
// SplitMix64 seeded with seed. The values are computed in float64 and rounded to float32.
func sineData(n, steps int, seed uint64) (x, y *tensors.Tensor) {
	rng := splitMix64{state: seed}
	xs := make([]float32, n*steps)
	ys := make([]float32, n)
	for i := range n {
		w := 0.3 + 0.5*rng.float64()
		phase := 2 * math.Pi * rng.float64()
		for t := range steps {
			xs[i*steps+t] = float32(math.Sin(w*float64(t) + phase))
		}
		ys[i] = float32(math.Sin(w*float64(steps) + phase))
	}
	return tensors.FromFlatDataAndDimensions(xs, n, steps, 1), tensors.FromFlatDataAndDimensions(ys, n, 1)
}
