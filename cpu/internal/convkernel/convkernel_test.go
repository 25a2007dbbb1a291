package convkernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
)

func TestMain(m *testing.M) { computetest.Main(m) }

// withKernels runs fn with Install in effect, and restores the previous state.
func withKernels(t testing.TB, installed bool, fn func()) {
	t.Helper()
	was := Installed()
	if installed {
		require.NoError(t, Install())
	} else {
		Uninstall()
	}
	defer func() {
		if was {
			require.NoError(t, Install())
		} else {
			Uninstall()
		}
	}()
	fn()
}

// convConfig is one ConvGeneral as the backend receives it.
type convConfig struct {
	name                                    string
	inputDims, kernelDims                   []int
	axes                                    backends.ConvolveAxesConfig
	strides, inputDilations, kernelDilation []int
	paddings                                [][2]int
}

// randomConvConfig draws a convolution with 1–3 spatial axes, channels first or last, random strides,
// asymmetric padding, kernel and input dilations, and kernels stored either HWIO or OIHW.
func randomConvConfig(rng *rand.Rand, i int) convConfig {
	numSpatial := 1 + rng.IntN(3)
	if numSpatial == 3 && rng.IntN(2) == 0 {
		numSpatial = 2
	}
	batch, in, out := 1+rng.IntN(3), 1+rng.IntN(4), 1+rng.IntN(4)
	c := convConfig{}
	spatial, kernel := make([]int, numSpatial), make([]int, numSpatial)
	for j := range numSpatial {
		kernel[j] = 1 + rng.IntN(3)
		c.kernelDilation = append(c.kernelDilation, 1+rng.IntN(2))
		c.inputDilations = append(c.inputDilations, 1+rng.IntN(2)*rng.IntN(2))
		c.strides = append(c.strides, 1+rng.IntN(2))
		spatial[j] = 2 + rng.IntN(5) + (kernel[j]-1)*c.kernelDilation[j]
		c.paddings = append(c.paddings, [2]int{rng.IntN(3), rng.IntN(3)})
	}
	channelsFirst, oihw := rng.IntN(2) == 0, rng.IntN(2) == 0
	seq := func(from, n int) []int {
		s := make([]int, n)
		for j := range s {
			s[j] = from + j
		}
		return s
	}
	if channelsFirst {
		c.inputDims = append([]int{batch, in}, spatial...)
		c.axes.InputBatch, c.axes.InputChannels, c.axes.InputSpatial = 0, 1, seq(2, numSpatial)
		c.axes.OutputBatch, c.axes.OutputChannels, c.axes.OutputSpatial = 0, 1, seq(2, numSpatial)
	} else {
		c.inputDims = append(append([]int{batch}, spatial...), in)
		c.axes.InputBatch, c.axes.InputChannels, c.axes.InputSpatial = 0, numSpatial+1, seq(1, numSpatial)
		c.axes.OutputBatch, c.axes.OutputChannels, c.axes.OutputSpatial = 0, numSpatial+1, seq(1, numSpatial)
	}
	if oihw {
		c.kernelDims = append([]int{out, in}, kernel...)
		c.axes.KernelOutputChannels, c.axes.KernelInputChannels, c.axes.KernelSpatial = 0, 1, seq(2, numSpatial)
	} else {
		c.kernelDims = append(append(append([]int{}, kernel...), in), out)
		c.axes.KernelSpatial, c.axes.KernelInputChannels, c.axes.KernelOutputChannels = seq(0, numSpatial), numSpatial, numSpatial+1
	}
	c.name = fmt.Sprintf("%d/%dd/first=%v/oihw=%v/in%v/k%v/s%v/d%v/id%v/p%v", i, numSpatial, channelsFirst, oihw,
		c.inputDims, c.kernelDims, c.strides, c.kernelDilation, c.inputDilations, c.paddings)
	return c
}

func (c convConfig) build(x, kernel *graph.Node) *graph.Node {
	return graph.ConvGeneral(x, kernel, c.axes, c.strides, c.paddings, c.inputDilations, c.kernelDilation, 1, 1)
}

// run executes c on the pure-Go backend, with the kernels installed or with simplego's own executor.
func (c convConfig) run(t *testing.T, installed bool, input, kernel *tensors.Tensor) *tensors.Tensor {
	var out *tensors.Tensor
	withKernels(t, installed, func() {
		exec, err := graph.NewExec(computetest.PureGo(t), c.build)
		require.NoError(t, err)
		defer exec.Finalize()
		in, err := input.LocalClone()
		require.NoError(t, err)
		k, err := kernel.LocalClone()
		require.NoError(t, err)
		outputs, err := exec.Exec(in, k)
		require.NoError(t, err)
		out = outputs[0]
	})
	return out
}

// TestConvGeneralMatchesSimplego compares the im2col + gemm executor with simplego's own convolution on
// random configurations, in float32 and float64.
func TestConvGeneralMatchesSimplego(t *testing.T) {
	withKernels(t, true, func() {}) // The first Install runs a self-test convolution: not counted below.
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 60 {
		c := randomConvConfig(rng, i)
		for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64} {
			t.Run(c.name+"/"+dtype.String(), func(t *testing.T) {
				input := computetest.RandomTensor(rng, shapes.Make(dtype, c.inputDims...))
				kernel := computetest.RandomTensor(rng, shapes.Make(dtype, c.kernelDims...))
				before := Calls()
				got := c.run(t, true, input, kernel)
				assert.Equal(t, before.Convolutions+1, Calls().Convolutions, "the convolution did not run on the kernel")
				want := c.run(t, false, input, kernel)
				require.True(t, want.Shape().Equal(got.Shape()), "shape %s, want %s", got.Shape(), want.Shape())
				tolerance := 1e-12
				if dtype == dtypes.Float32 {
					tolerance = 1e-5
				}
				assertClose(t, flat64(got), flat64(want), tolerance)
			})
		}
	}
}

// TestKernelGradientLayoutMatchesSimplego covers the layout of a channels-last convolution's kernel
// gradient — input [in, spatial..., batch], kernel [in, spatial..., out], output [spatial..., batch, out] —
// which the executor packs transposed, with strides, dilations and padding.
func TestKernelGradientLayoutMatchesSimplego(t *testing.T) {
	withKernels(t, true, func() {})
	rng := rand.New(rand.NewPCG(21, 22))
	for i := range 30 {
		c := randomDualConfig(rng, 4, 3, 3)
		for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64} {
			t.Run(fmt.Sprintf("%d/in%v/k%v/s%v/d%v/p%v/%s", i, c.inputDims, c.kernelDims, c.strides, c.kernelDilation,
				c.paddings, dtype), func(t *testing.T) {
				plan, ok, err := newConvPlan(shapes.Make(dtype, c.inputDims...), shapes.Make(dtype, c.kernelDims...),
					&convParams{axes: c.axes, strides: c.strides, paddings: c.paddings, inputDilations: c.inputDilations,
						kernelDilations: c.kernelDilation})
				require.NoError(t, err)
				require.True(t, ok && plan.dual, "the layout was not recognised")
				input := computetest.RandomTensor(rng, shapes.Make(dtype, c.inputDims...))
				kernel := computetest.RandomTensor(rng, shapes.Make(dtype, c.kernelDims...))
				got, want := c.run(t, true, input, kernel), c.run(t, false, input, kernel)
				require.True(t, want.Shape().Equal(got.Shape()), "shape %s, want %s", got.Shape(), want.Shape())
				tolerance := 1e-12
				if dtype == dtypes.Float32 {
					tolerance = 1e-5
				}
				assertClose(t, flat64(got), flat64(want), tolerance)
			})
		}
	}
}

// randomDualConfig draws a convolution in the layout of a channels-last convolution's kernel gradient —
// input [in, spatial..., batch], kernel [in, spatial..., out], output [spatial..., batch, out] — with one or
// two spatial axes, strides, kernel dilations and padding, and up to maxBatch, maxIn and maxOut of each.
func randomDualConfig(rng *rand.Rand, maxBatch, maxIn, maxOut int) convConfig {
	numSpatial := 1 + rng.IntN(2)
	batch, in, out := 1+rng.IntN(maxBatch), 1+rng.IntN(maxIn), 1+rng.IntN(maxOut)
	c := convConfig{}
	c.inputDims, c.kernelDims = []int{in}, []int{in}
	for j := range numSpatial {
		k := 1 + rng.IntN(4)
		c.kernelDilation = append(c.kernelDilation, 1+rng.IntN(2))
		c.strides = append(c.strides, 1+rng.IntN(2))
		c.inputDilations = append(c.inputDilations, 1)
		c.paddings = append(c.paddings, [2]int{rng.IntN(2), rng.IntN(2)})
		c.inputDims = append(c.inputDims, 3+rng.IntN(4)+(k-1)*c.kernelDilation[j])
		c.kernelDims = append(c.kernelDims, k)
	}
	c.inputDims, c.kernelDims = append(c.inputDims, batch), append(c.kernelDims, out)
	c.axes = backends.ConvolveAxesConfig{
		InputChannels: 0, InputSpatial: seq(1, numSpatial), InputBatch: numSpatial + 1,
		KernelInputChannels: 0, KernelSpatial: seq(1, numSpatial), KernelOutputChannels: numSpatial + 1,
		OutputSpatial: seq(0, numSpatial), OutputBatch: numSpatial, OutputChannels: numSpatial + 1,
	}
	c.name = fmt.Sprintf("in%v/k%v/s%v/d%v/p%v", c.inputDims, c.kernelDims, c.strides, c.kernelDilation, c.paddings)
	return c
}

// TestGroupedConvolutionFallsBack checks that channel grouping keeps simplego's executor (and its result).
func TestGroupedConvolutionFallsBack(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	input := computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, 2, 5, 5, 4))
	kernel := computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, 3, 3, 2, 6))
	grouped := func(x, k *graph.Node) *graph.Node {
		// simplego's grouped convolution needs explicit strides and kernel dilations (it indexes them).
		axes := backends.ConvolveAxesConfig{InputBatch: 0, InputSpatial: []int{1, 2}, InputChannels: 3,
			KernelSpatial: []int{0, 1}, KernelInputChannels: 2, KernelOutputChannels: 3,
			OutputBatch: 0, OutputSpatial: []int{1, 2}, OutputChannels: 3}
		return graph.ConvGeneral(x, k, axes, []int{1, 1}, nil, nil, []int{1, 1}, 2, 1)
	}
	var got *tensors.Tensor
	withKernels(t, true, func() {
		before := Calls()
		got = graph.MustExecOnce(computetest.PureGo(t), grouped, input, kernel)
		assert.Equal(t, before.ConvolutionFallbacks+1, Calls().ConvolutionFallbacks)
		assert.Equal(t, before.Convolutions, Calls().Convolutions)
	})
	withKernels(t, false, func() {
		assertClose(t, flat64(got), flat64(graph.MustExecOnce(computetest.PureGo(t), grouped, input, kernel)), 0)
	})
}

func flat64(t *tensors.Tensor) []float64 {
	switch t.DType() {
	case dtypes.Float32:
		values := tensors.MustCopyFlatData[float32](t)
		out := make([]float64, len(values))
		for i, v := range values {
			out[i] = float64(v)
		}
		return out
	default:
		return tensors.MustCopyFlatData[float64](t)
	}
}

// assertClose checks |got−want| ≤ tolerance·max(|want|, 1) element by element (NaN only against NaN).
func assertClose(t *testing.T, got, want []float64, tolerance float64) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		if math.IsNaN(want[i]) {
			require.True(t, math.IsNaN(got[i]), "element %d: %g, want NaN", i, got[i])
			continue
		}
		if got[i] == want[i] { // Also infinities (the identity of an empty window).
			continue
		}
		require.LessOrEqual(t, math.Abs(got[i]-want[i]), tolerance*max(math.Abs(want[i]), 1),
			"element %d: %g, want %g", i, got[i], want[i])
	}
}

// TestIm2col2DRuns compares im2col2D with a direct construction of the patch matrix, for channel counts on
// both sides of smallCopy's run length (so both the loop and copy take the contiguous-run path) and
// strides and paddings that break runs.
func TestIm2col2DRuns(t *testing.T) {
	const batch, height, width, kernelSize = 2, 5, 6, 3
	for _, channels := range []int{1, 3, 8} {
		for _, stride := range []int{1, 2} {
			for _, pad := range []int{0, 1} {
				t.Run(fmt.Sprintf("c%d/s%d/p%d", channels, stride, pad), func(t *testing.T) {
					outHeight := (height+2*pad-kernelSize)/stride + 1
					outWidth := (width+2*pad-kernelSize)/stride + 1
					rows := positionTable(outHeight, kernelSize, height, stride, 1, 1, pad)
					cols := positionTable(outWidth, kernelSize, width, stride, 1, 1, pad)
					input := make([]float32, batch*height*width*channels)
					for i := range input {
						input[i] = float32(i + 1)
					}
					var want []float32
					for b := range batch {
						for oh := range outHeight {
							for ow := range outWidth {
								for kh := range kernelSize {
									for kw := range kernelSize {
										ih, iw := oh*stride+kh-pad, ow*stride+kw-pad
										for c := range channels {
											v := float32(0)
											if ih >= 0 && ih < height && iw >= 0 && iw < width {
												v = input[((b*height+ih)*width+iw)*channels+c]
											}
											want = append(want, v)
										}
									}
								}
							}
						}
					}
					patches := make([]float32, len(want))
					for i := range patches {
						patches[i] = -1 // every element must be written
					}
					im2col2D(patches, input, batch, height, width, channels, outHeight, outWidth, kernelSize, kernelSize, rows, cols)
					assert.Equal(t, want, patches)
				})
			}
		}
	}
}
