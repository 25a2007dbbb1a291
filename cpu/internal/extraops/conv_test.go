package extraops_test

import (
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/extraops"
)

// refConv is StableHLO's convolution of a channels-last 2D input [n, h, w, c] with a kernel [kh, kw, in,
// out], element by element: output channel o of group o/(out/groups) reads that group's input channels
// (channel grouping) or that group's batch slice (batch grouping).
func refConv(c convCase, input, kernel []float64) ([]float64, []int) {
	n, h, w, channels := c.inputDims[0], c.inputDims[1], c.inputDims[2], c.inputDims[3]
	kh, kw, kin, kout := c.kernelDims[0], c.kernelDims[1], c.kernelDims[2], c.kernelDims[3]
	stride, dilation := []int{1, 1}, []int{1, 1}
	padding := [][2]int{{0, 0}, {0, 0}}
	if c.strides != nil {
		stride = c.strides
	}
	if c.dilations != nil {
		dilation = c.dilations
	}
	if c.padding != nil {
		padding = c.padding
	}
	channelGroups, batchGroups := max(c.channelGroups, 1), max(c.batches, 1)
	outN := n / batchGroups
	outH := (h+padding[0][0]+padding[0][1]-((kh-1)*dilation[0]+1))/stride[0] + 1
	outW := (w+padding[1][0]+padding[1][1]-((kw-1)*dilation[1]+1))/stride[1] + 1
	outDims := []int{outN, outH, outW, kout}
	out := make([]float64, outN*outH*outW*kout)
	inStrides, kStrides, outStrides := strides(c.inputDims), strides(c.kernelDims), strides(outDims)
	forEachIndex(outDims, func(o []int) {
		b, oy, ox, co := o[0], o[1], o[2], o[3]
		channelBase := 0
		if channelGroups > 1 {
			channelBase = co / (kout / channelGroups) * (channels / channelGroups)
		}
		if batchGroups > 1 {
			b += co / (kout / batchGroups) * outN
		}
		sum := 0.0
		for ky := range kh {
			for kx := range kw {
				iy, ix := oy*stride[0]+ky*dilation[0]-padding[0][0], ox*stride[1]+kx*dilation[1]-padding[1][0]
				if iy < 0 || iy >= h || ix < 0 || ix >= w {
					continue
				}
				for ci := range kin {
					sum += input[flatIndex([]int{b, iy, ix, channelBase + ci}, inStrides)] *
						kernel[flatIndex([]int{ky, kx, ci, co}, kStrides)]
				}
			}
		}
		out[flatIndex(o, outStrides)] = sum
	})
	return out, outDims
}

// TestGroupedConvolutions compares grouped and batch-grouped convolutions (channels last) with refConv, in
// float64 and float32.
func TestGroupedConvolutions(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, c := range groupedConvCases {
		if c.channelsFirst {
			continue
		}
		input, kernel := randomTensor(rng, c.inputDims...), randomTensor(rng, c.kernelDims...)
		want, wantDims := refConv(c, float64s(t, input), float64s(t, kernel))
		for _, dtype := range []dtypes.DType{dtypes.Float64, dtypes.Float32} {
			t.Run(c.name+"/"+dtype.String(), func(t *testing.T) {
				before := extraops.Calls().GroupedConvolutions
				got := run(t, func(xs []*graph.Node) *graph.Node {
					return graph.ConvertDType(c.convolve(graph.ConvertDType(xs[0], dtype), graph.ConvertDType(xs[1], dtype)),
						dtypes.Float64)
				}, input, kernel)
				assert.Greater(t, extraops.Calls().GroupedConvolutions, before)
				require.Equal(t, wantDims, got.Shape().Dimensions)
				tolerance := 1e-12
				if dtype == dtypes.Float32 {
					tolerance = 1e-5
				}
				for i, v := range float64s(t, got) {
					require.InDelta(t, want[i], v, tolerance*(1+abs(want[i])), "element %d", i)
				}
			})
		}
	}
}

// TestConvolveWithoutStrides: graph.Convolve without Strides passes nil strides, which simplego's shape
// inference reads as 0; the builder passes 1s.
func TestConvolveWithoutStrides(t *testing.T) {
	c := convCase{inputDims: []int{1, 4, 4, 1}, kernelDims: []int{3, 3, 1, 2}, padding: [][2]int{{1, 1}, {1, 1}}}
	rng := rand.New(rand.NewPCG(23, 24))
	input, kernel := randomTensor(rng, c.inputDims...), randomTensor(rng, c.kernelDims...)
	want, _ := refConv(c, float64s(t, input), float64s(t, kernel))
	got := run(t, func(xs []*graph.Node) *graph.Node { return graph.Convolve(xs[0], xs[1]).PadSame().Done() }, input, kernel)
	assert.InDeltaSlice(t, want, float64s(t, got), 1e-12)
}

// TestLayersConvolutionChannelGroupCount documents GoMLX v0.26.0's own bug: layers.Convolution's
// ChannelGroupCount creates its kernel with all the input channels instead of input channels ÷ groups,
// and graph.Convolve rejects it, on every backend. graph.Convolve with a kernel of the right shape works
// (TestGroupedConvolutions). If this test fails, GoMLX fixed it: update docs/cpu.md.
func TestLayersConvolutionChannelGroupCount(t *testing.T) {
	g := graph.NewGraph(pureGo(t), "layers_grouped")
	defer g.Finalize()
	ctx := context.New()
	x := graph.Zeros(g, shapes.Make(dtypes.Float32, 2, 6, 6, 4))
	require.PanicsWithError(t, "kernel input channels (4) must equal input channels (4) divided by FeatureGroupCount (2)",
		func() { layers.Convolution(ctx, x).Filters(4).KernelSize(3).PadSame().ChannelGroupCount(2).Done() })
}

// TestBooleanPooling: max and min pooling of booleans (or and and over windows), which simplego cannot
// reduce, as layers.DropBlock pools its mask.
func TestBooleanPooling(t *testing.T) {
	mask := tensors.FromValue([][]bool{
		{true, true, false, true},
		{true, true, true, true},
		{false, true, true, true},
	})
	before := extraops.Calls().BooleanWindows
	got := run(t, func(xs []*graph.Node) *graph.Node {
		x := graph.Reshape(xs[0], 1, 3, 4, 1)
		minPool := graph.MinPool(x).Window(2).Strides(1).PadSame().Done()
		maxPool := graph.MaxPool(graph.LogicalNot(x)).Window(2).Strides(1).PadSame().Done()
		return graph.Concatenate([]*graph.Node{graph.Reshape(minPool, 3, 4), graph.Reshape(maxPool, 3, 4)}, 0)
	}, mask)
	// PadSame with a window of 2 pads after: each window is the position, its right and below neighbours.
	wantMin := [][]bool{
		{true, false, false, true},
		{false, true, true, true},
		{false, true, true, true},
	}
	want := make([][]bool, 0, 6)
	want = append(want, wantMin...)
	for _, row := range wantMin {
		negated := make([]bool, len(row))
		for i, v := range row {
			negated[i] = !v
		}
		want = append(want, negated)
	}
	assert.Equal(t, want, got.Value())
	assert.Greater(t, extraops.Calls().BooleanWindows, before)
}
