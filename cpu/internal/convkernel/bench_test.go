package convkernel

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/threads"
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

// BenchmarkConvolveResNet times a ResNet's first-stage 3×3 convolution ([64, 14, 14, 16] by [3, 3, 16, 16],
// channels last, padded to keep its size) on the direct kernel with one compute thread and with two, the
// product split over both from any size.
func BenchmarkConvolveResNet(b *testing.B) {
	if !canRunDirect(&convPlan{}) {
		b.Skip("no direct kernel on this processor")
	}
	input, kernel := shapes.Make(dtypes.Float32, 64, 14, 14, 16), shapes.Make(dtypes.Float32, 3, 3, 16, 16)
	axes := backends.ConvolveAxesConfig{InputBatch: 0, InputSpatial: []int{1, 2}, InputChannels: 3,
		KernelSpatial: []int{0, 1}, KernelInputChannels: 2, KernelOutputChannels: 3,
		OutputBatch: 0, OutputSpatial: []int{1, 2}, OutputChannels: 3}
	plan, ok, err := newConvPlan(input, kernel, &convParams{axes: axes, paddings: [][2]int{{1, 1}, {1, 1}}})
	if !ok || err != nil {
		b.Fatal(ok, err)
	}
	x, w, out := make([]float32, input.Size()), make([]float32, kernel.Size()), make([]float32, product(plan.outputDims))
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range x {
		x[i] = rng.Float32()
	}
	for i := range w {
		w[i] = rng.Float32()
	}
	saved := threads.Budget()
	defer threads.Set(saved)
	for _, n := range []int{1, 2} {
		b.Run(fmt.Sprintf("threads=%d", n), func(b *testing.B) {
			threads.Set(n)
			for b.Loop() {
				convolve(plan, x, w, out, &scratch32, true)
			}
			b.ReportMetric(2*float64(len(out))*float64(plan.patchLength())*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkKernelGradientCNN times the kernel gradients of the demo CNN's two convolutions (batch 64, 3×3,
// same padding): the dual plans, whose contraction runs over the batch and the image.
func BenchmarkKernelGradientCNN(b *testing.B) {
	if !canRunDirect(&convPlan{}) {
		b.Skip("no direct kernel on this processor")
	}
	axes := backends.ConvolveAxesConfig{InputChannels: 0, InputSpatial: []int{1, 2}, InputBatch: 3,
		KernelInputChannels: 0, KernelSpatial: []int{1, 2}, KernelOutputChannels: 3,
		OutputSpatial: []int{0, 1}, OutputBatch: 2, OutputChannels: 3}
	for _, c := range []struct{ side, in, out int }{{28, 1, 16}, {14, 16, 32}} {
		input, kernel := shapes.Make(dtypes.Float32, 64, c.side, c.side, c.in), shapes.Make(dtypes.Float32, 64, c.side, c.side, c.out)
		plan, ok, err := newConvPlan(input, kernel, &convParams{axes: axes, paddings: [][2]int{{1, 1}, {1, 1}}})
		if !ok || err != nil || !plan.dual {
			b.Fatal(ok, err)
		}
		x, dy, dw := make([]float32, input.Size()), make([]float32, kernel.Size()), make([]float32, product(plan.outputDims))
		rng := rand.New(rand.NewPCG(1, 1))
		for i := range x {
			x[i] = rng.Float32()
		}
		for i := range dy {
			dy[i] = rng.Float32()
		}
		b.Run(fmt.Sprintf("%dx%dx%d→%d", c.side, c.side, c.in, c.out), func(b *testing.B) {
			for b.Loop() {
				convolve(plan, x, dy, dw, &scratch32, true)
			}
			b.ReportMetric(2*float64(len(dw))*float64(plan.patchLength())*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
