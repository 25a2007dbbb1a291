package extraops_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/core/tensors/images"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/cpu/internal/extraops"
)

// randomShape returns dimensions of rank 1 to maxRank, each 1 to 4, or 0 with zeroSize.
func randomShape(rng *rand.Rand, maxRank int, zeroSize bool) []int {
	dims := make([]int, 1+rng.IntN(maxRank))
	for a := range dims {
		dims[a] = 1 + rng.IntN(4)
	}
	if zeroSize {
		dims[rng.IntN(len(dims))] = 0
	}
	return dims
}

// TestPadGradients: gradients of Pad's operand and fill value, with edge, negative and interior padding.
func TestPadGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for trial := range 16 {
		dims := randomShape(rng, 3, trial%8 == 7)
		config := randomPadConfig(rng, dims)
		t.Run(fmt.Sprintf("%v/%+v", dims, config), func(t *testing.T) {
			gradCase{f: func(xs []*graph.Node) *graph.Node {
				return graph.Pad(xs[0], xs[1], config...)
			}, inputs: []*tensors.Tensor{randomTensor(rng, dims...), tensors.FromScalar(0.5)},
				diff: []bool{true, true}}.check(t)
		})
	}
}

// TestSliceGradients: GoMLX's gradient of Slice pads (with interior padding for strides).
func TestSliceGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	x := randomTensor(rng, 5, 7)
	for _, ranges := range [][]graph.SliceAxisSpec{
		{graph.AxisRange(1, 4), graph.AxisRange(2)},
		{graph.AxisRange().Stride(2), graph.AxisRange(1, 7).Stride(3)},
		{graph.AxisRange(4, 5), graph.AxisRange(0, 6).Stride(4)},
	} {
		t.Run("", func(t *testing.T) {
			gradCase{f: func(xs []*graph.Node) *graph.Node { return graph.Slice(xs[0], ranges...) },
				inputs: []*tensors.Tensor{x}, diff: []bool{true}}.check(t)
		})
	}
}

// TestReverseGradients: Reverse's gradient on random shapes and axes.
func TestReverseGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for trial := range 8 {
		dims := randomShape(rng, 4, trial == 7)
		var axes []int
		for a := range dims {
			if rng.IntN(2) == 0 {
				axes = append(axes, a)
			}
		}
		t.Run(fmt.Sprintf("%v/%v", dims, axes), func(t *testing.T) {
			gradCase{f: func(xs []*graph.Node) *graph.Node { return graph.Reverse(xs[0], axes...) },
				inputs: []*tensors.Tensor{randomTensor(rng, dims...)}, diff: []bool{true}}.check(t)
		})
	}
}

// TestDynamicSliceGradients: gradients of DynamicSlice's operand and of DynamicUpdateSlice's operand and
// update, with start indices in and out of range (clamped), given as inputs of int32 and int64.
func TestDynamicSliceGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for trial := range 10 {
		dims := randomShape(rng, 3, trial == 9)
		sizes := make([]int, len(dims))
		starts32, starts64 := make([]int32, len(dims)), make([]int64, len(dims))
		for a, d := range dims {
			sizes[a] = rng.IntN(d + 1)
			starts32[a] = int32(rng.IntN(d+5) - 2)
			starts64[a] = int64(starts32[a])
		}
		x, update := randomTensor(rng, dims...), randomTensor(rng, sizes...)
		t.Run(fmt.Sprintf("%v/%v/at%v", dims, sizes, starts32), func(t *testing.T) {
			t.Run("DynamicSlice", func(t *testing.T) {
				gradCase{f: func(xs []*graph.Node) *graph.Node {
					return graph.DynamicSlice(xs[0], []*graph.Node{xs[1]}, sizes)
				}, inputs: []*tensors.Tensor{x, tensors.FromValue(starts32)}, diff: []bool{true, false}}.check(t)
			})
			t.Run("DynamicUpdateSlice", func(t *testing.T) {
				gradCase{f: func(xs []*graph.Node) *graph.Node {
					indices := make([]*graph.Node, len(dims))
					for a := range indices {
						indices[a] = graph.Reshape(graph.Slice(xs[2], graph.AxisElem(a)))
					}
					return graph.DynamicUpdateSlice(xs[0], xs[1], indices)
				}, inputs: []*tensors.Tensor{x, update, tensors.FromValue(starts64)}, diff: []bool{true, true, false}}.check(t)
			})
		})
	}
}

// convCase is a 2D convolution with grouping.
type convCase struct {
	name                   string
	inputDims, kernelDims  []int // channels last: [batch, h, w, c] and [kh, kw, in, out]
	strides                []int
	padding                [][2]int
	dilations              []int
	channelGroups, batches int
	channelsFirst          bool
}

var groupedConvCases = []convCase{
	{name: "2 groups 3x3 same", inputDims: []int{2, 5, 5, 4}, kernelDims: []int{3, 3, 2, 6}, padding: [][2]int{{1, 1}, {1, 1}}, channelGroups: 2},
	{name: "2 groups 2x2 even kernel", inputDims: []int{1, 5, 4, 4}, kernelDims: []int{2, 2, 2, 4}, padding: [][2]int{{0, 1}, {1, 0}}, channelGroups: 2},
	{name: "3 groups strided", inputDims: []int{2, 7, 6, 6}, kernelDims: []int{3, 2, 2, 3}, strides: []int{2, 3}, channelGroups: 3},
	{name: "depthwise dilated", inputDims: []int{1, 6, 6, 3}, kernelDims: []int{2, 2, 1, 6}, dilations: []int{2, 1}, padding: [][2]int{{1, 1}, {0, 0}}, channelGroups: 3},
	{name: "channels first", inputDims: []int{2, 4, 5, 5}, kernelDims: []int{4, 2, 3, 3}, padding: [][2]int{{1, 1}, {1, 1}}, channelGroups: 2, channelsFirst: true},
	{name: "2 batch groups", inputDims: []int{4, 5, 5, 2}, kernelDims: []int{3, 3, 2, 6}, padding: [][2]int{{1, 1}, {1, 1}}, batches: 2},
	{name: "3 batch groups strided", inputDims: []int{3, 6, 5, 2}, kernelDims: []int{2, 3, 2, 3}, strides: []int{2, 1}, batches: 3},
}

// convolve builds the case's convolution with graph.Convolve, as a user would.
func (c convCase) convolve(x, kernel *graph.Node) *graph.Node {
	conv := graph.Convolve(x, kernel)
	if c.channelsFirst {
		conv = conv.ChannelsAxis(images.ChannelsFirst)
	}
	if c.strides != nil {
		conv = conv.StridePerAxis(c.strides...)
	}
	if c.padding != nil {
		conv = conv.PaddingPerDim(c.padding)
	}
	if c.dilations != nil {
		conv = conv.DilationPerAxis(c.dilations...)
	}
	if c.channelGroups > 1 {
		conv = conv.ChannelGroupCount(c.channelGroups)
	}
	if c.batches > 1 {
		conv = conv.BatchGroupCount(c.batches)
	}
	return conv.Done()
}

// TestGroupedConvolutionGradients: gradients of convolutions with channel (grouped, depthwise) and batch
// grouping, against central differences.
func TestGroupedConvolutionGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	for _, c := range groupedConvCases {
		t.Run(c.name, func(t *testing.T) {
			gradCase{f: func(xs []*graph.Node) *graph.Node { return c.convolve(xs[0], xs[1]) },
				inputs: []*tensors.Tensor{randomTensor(rng, c.inputDims...), randomTensor(rng, c.kernelDims...)},
				diff:   []bool{true, true}}.check(t)
		})
	}
}

// TestGroupedConvolutionGradientsGoMLXRules: with GoMLX's own gradients (GOACCEL_GRADIENTS=gomlx, whose
// rule for ungrouped convolutions reverses the kernel), grouped convolutions differentiate too. GoMLX's
// input gradient is off by one position for kernels of even size (see convgraph), so odd kernels only.
func TestGroupedConvolutionGradientsGoMLXRules(t *testing.T) {
	_, err := cpu.New(cpu.Config{Backend: cpu.PureGo, Gradients: "gomlx"})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := cpu.New(cpu.Config{Backend: cpu.PureGo})
		require.NoError(t, err)
	})
	require.True(t, extraops.GradientsRegistered())
	before := extraops.Calls().Reverses
	rng := rand.New(rand.NewPCG(19, 20))
	for _, c := range groupedConvCases {
		if c.channelsFirst || c.kernelDims[0]%2 == 0 || c.kernelDims[1]%2 == 0 {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			gradCase{f: func(xs []*graph.Node) *graph.Node { return c.convolve(xs[0], xs[1]) },
				inputs: []*tensors.Tensor{randomTensor(rng, c.inputDims...), randomTensor(rng, c.kernelDims...)},
				diff:   []bool{true, true}}.check(t)
		})
	}
	require.Greater(t, extraops.Calls().Reverses, before, "GoMLX's rule reverses kernels")
}

// TestGroupedConvolutionsLoweredToSlices: with convolutions lowered to slices and dots (GOACCEL_CONV=graph),
// grouped convolutions run and differentiate too, each group lowered.
func TestGroupedConvolutionsLoweredToSlices(t *testing.T) {
	backend, err := cpu.New(cpu.Config{Backend: cpu.PureGo, Convolutions: "graph"})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := cpu.New(cpu.Config{Backend: cpu.PureGo})
		require.NoError(t, err)
	})
	rng := rand.New(rand.NewPCG(25, 26))
	for _, c := range groupedConvCases {
		t.Run(c.name, func(t *testing.T) {
			input, kernel := randomTensor(rng, c.inputDims...), randomTensor(rng, c.kernelDims...)
			if !c.channelsFirst {
				want, _ := refConv(c, float64s(t, input), float64s(t, kernel))
				got := runOn(t, backend, func(xs []*graph.Node) *graph.Node { return c.convolve(xs[0], xs[1]) }, input, kernel)
				require.InDeltaSlice(t, want, float64s(t, got), 1e-12)
			}
			gradCase{f: func(xs []*graph.Node) *graph.Node { return c.convolve(xs[0], xs[1]) },
				inputs: []*tensors.Tensor{input, kernel}, diff: []bool{true, true}, backend: backend}.check(t)
		})
	}
}
