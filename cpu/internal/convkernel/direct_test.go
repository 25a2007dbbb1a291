package convkernel

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
	"github.com/goaccel/goaccel/cpu/internal/gemmtile"
	"github.com/goaccel/goaccel/cpu/internal/threads"
)

// withOutChannels gives c's kernel out output channels.
func (c convConfig) withOutChannels(out int) convConfig {
	c.kernelDims = slices.Clone(c.kernelDims)
	c.kernelDims[c.axes.KernelOutputChannels] = out
	c.name = fmt.Sprintf("%s/out%d", c.name, out)
	return c
}

// TestDirectConvolutionMatchesSimplego runs float32 convolutions with output channels in whole tiles of
// the micro-kernel (16 and 8 columns) and ragged ones, one or two spatial axes, channels first or last, with
// strides, kernel dilations and asymmetric padding, against simplego's own convolution: they must run on
// the direct path and agree to float32 rounding.
func TestDirectConvolutionMatchesSimplego(t *testing.T) {
	if !gemmtile.Accelerated() {
		t.Skip("the direct path needs AVX2 and FMA, which this processor lacks: convolutions run as im2col + gemm")
	}
	withKernels(t, true, func() {})
	rng := rand.New(rand.NewPCG(31, 32))
	ran := 0
	for i := 0; ran < 40; i++ {
		c := randomConvConfig(rng, i)
		if len(c.inputDims) > 4 || slices.ContainsFunc(c.inputDilations, func(d int) bool { return d != 1 }) {
			continue // three spatial axes or input dilation: the im2col path, tested elsewhere
		}
		ran++
		c = c.withOutChannels(1 + rng.IntN(40))
		t.Run(c.name, func(t *testing.T) { checkRunsDirect(t, rng, c) })
	}
}

// checkRunsDirect runs c in float32 with the kernels and with simplego's own convolution: it must run on the
// direct path, and agree to float32 rounding.
func checkRunsDirect(t *testing.T, rng *rand.Rand, c convConfig) {
	input := computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, c.inputDims...))
	kernel := computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, c.kernelDims...))
	before := Calls()
	got := c.run(t, true, input, kernel)
	assert.Equal(t, before.DirectConvolutions+1, Calls().DirectConvolutions, "the convolution did not run directly")
	want := c.run(t, false, input, kernel)
	require.True(t, want.Shape().Equal(got.Shape()), "shape %s, want %s", got.Shape(), want.Shape())
	assertClose(t, flat64(got), flat64(want), 1e-5)
}

// TestDirectKernelGradientMatchesSimplego: the dual layout (a channels-last convolution's kernel gradient)
// on the direct path, batch sizes that leave a short last tile of rows, against simplego.
func TestDirectKernelGradientMatchesSimplego(t *testing.T) {
	if !gemmtile.Accelerated() {
		t.Skip("the direct path needs AVX2 and FMA, which this processor lacks: convolutions run as im2col + gemm")
	}
	withKernels(t, true, func() {})
	rng := rand.New(rand.NewPCG(33, 34))
	for i := range 25 {
		c := randomDualConfig(rng, 7, 5, 33)
		t.Run(fmt.Sprintf("%d/%s", i, c.name), func(t *testing.T) { checkRunsDirect(t, rng, c) })
	}
}

// TestDirectConvolutionSplitsAcrossThreads: a product large enough to be split among threads gives the
// single-threaded result bit for bit (each tile is computed by one thread, in the same order).
func TestDirectConvolutionSplitsAcrossThreads(t *testing.T) {
	if !gemmtile.Accelerated() {
		t.Skip("the direct path needs AVX2 and FMA, which this processor lacks")
	}
	rng := rand.New(rand.NewPCG(35, 36))
	p, ok, err := newConvPlan(shapes.Make(dtypes.Float32, 32, 28, 28, 16), shapes.Make(dtypes.Float32, 3, 3, 16, 32),
		&convParams{axes: backends.ConvolveAxesConfig{InputBatch: 0, InputSpatial: []int{1, 2}, InputChannels: 3,
			KernelSpatial: []int{0, 1}, KernelInputChannels: 2, KernelOutputChannels: 3,
			OutputBatch: 0, OutputSpatial: []int{1, 2}, OutputChannels: 3},
			strides: []int{1, 1}, paddings: [][2]int{{1, 1}, {1, 1}}})
	require.NoError(t, err)
	require.True(t, ok && canRunDirect(p))
	input := make([]float32, 32*28*28*16)
	kernel := make([]float32, 3*3*16*32)
	for i := range input {
		input[i] = rng.Float32()
	}
	for i := range kernel {
		kernel[i] = rng.Float32()
	}
	outputs := map[int][]float32{}
	for _, n := range []int{1, 2, 3} {
		setThreads(t, n)
		outputs[n] = make([]float32, 32*28*28*32)
		convolveDirect(p, input, kernel, outputs[n], &scratch32)
	}
	assert.Equal(t, outputs[1], outputs[2])
	assert.Equal(t, outputs[1], outputs[3])
}

func setThreads(t *testing.T, n int) {
	t.Helper()
	previous := threads.Budget()
	threads.Set(n)
	t.Cleanup(func() { threads.Set(previous) })
}
