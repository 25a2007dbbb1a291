package convkernel

import (
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/backends"
)

// BenchmarkMaxPool2x2 times the window walks of a 2×2 max-pooling of the demo CNN's first activation,
// [64, 28, 28, 16] channels last: forward (ReduceWindow) and gradient (SelectAndScatter).
func BenchmarkMaxPool2x2(b *testing.B) {
	dims := []int{64, 28, 28, 16}
	plan, err := newWindowPlan(dims, []int{1, 2, 2, 1}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	operand := make([]float32, product(dims))
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range operand {
		operand[i] = rng.Float32()
	}
	pooled := make([]float32, product(plan.outputDims))
	gradient := make([]float32, len(operand))
	b.Run("ReduceWindow", func(b *testing.B) {
		for b.Loop() {
			reduceWindows(plan, backends.ReduceOpMax, operand, pooled)
		}
	})
	b.Run("SelectAndScatter", func(b *testing.B) {
		for b.Loop() {
			selectAndScatter(plan, true, operand, pooled, gradient)
		}
	})
}
