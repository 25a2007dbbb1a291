package convgraph

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/core/tensors/images"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
	"github.com/goaccel/goaccel/cpu/internal/convkernel"
)

// smoothLoss turns a node into a scalar whose gradient with respect to the node is neither constant nor
// symmetric: a fixed weighting of its elements plus a quadratic term. Its central differences have no
// truncation error on a linear operation (a quadratic's third derivative is zero), only rounding.
func smoothLoss(out *graph.Node) *graph.Node {
	weights := graph.Cos(graph.MulScalar(graph.IotaFull(out.Graph(), out.Shape()), 0.37))
	return graph.Add(graph.ReduceAllSum(graph.Mul(out, weights)),
		graph.MulScalar(graph.ReduceAllSum(graph.Square(out)), 0.25))
}

// gradients returns graph.Gradient of loss with respect to each input, run on backend. It runs on local
// copies of the inputs, since a tensor used on one backend cannot be used on another.
func gradients(t *testing.T, backend backends.Backend, loss func(inputs []*graph.Node) *graph.Node,
	inputs []*tensors.Tensor) (grads []*tensors.Tensor, err error) {
	t.Helper()
	exec, err := graph.NewExecAny(backend, func(inputs []*graph.Node) []*graph.Node {
		return graph.Gradient(loss(inputs), inputs...)
	})
	if err != nil {
		return nil, err
	}
	defer exec.Finalize()
	args := make([]any, len(inputs))
	for i, input := range inputs {
		if args[i], err = input.LocalClone(); err != nil {
			return nil, err
		}
	}
	return exec.Exec(args...)
}

// finiteDifferences returns the central differences (f(x+h)-f(x-h))/2h of loss with respect to every element
// of every (Float64) input.
func finiteDifferences(t *testing.T, backend backends.Backend, loss func(inputs []*graph.Node) *graph.Node,
	inputs []*tensors.Tensor, h float64) [][]float64 {
	t.Helper()
	exec, err := graph.NewExecAny(backend, loss)
	require.NoError(t, err)
	defer exec.Finalize()
	evaluate := func(args []any) float64 {
		outputs, err := exec.Exec(args...)
		require.NoError(t, err)
		return tensors.ToScalar[float64](outputs[0])
	}
	args := make([]any, len(inputs))
	for i, input := range inputs {
		args[i] = input
	}
	differences := make([][]float64, len(inputs))
	for i, input := range inputs {
		values := tensors.MustCopyFlatData[float64](input)
		dims := input.Shape().Dimensions
		differences[i] = make([]float64, len(values))
		for j, value := range values {
			perturbed := func(delta float64) float64 {
				shifted := append([]float64(nil), values...)
				shifted[j] = value + delta
				args[i] = tensors.FromFlatDataAndDimensions(shifted, dims...)
				defer func() { args[i] = input }()
				return evaluate(args)
			}
			differences[i][j] = (perturbed(h) - perturbed(-h)) / (2 * h)
		}
	}
	return differences
}

// maxRelativeError returns the largest |got-want| / max(|want|, 1) over all elements.
func maxRelativeError(t *testing.T, got []*tensors.Tensor, want [][]float64) float64 {
	t.Helper()
	require.Len(t, got, len(want))
	var worst float64
	for i := range want {
		values := tensors.MustCopyFlatData[float64](got[i])
		require.Len(t, values, len(want[i]), "gradient %d", i)
		for j := range values {
			worst = max(worst, math.Abs(values[j]-want[i][j])/max(math.Abs(want[i][j]), 1))
		}
	}
	return worst
}

// convCase is a convolution as layers.Convolution and graph.Convolve build them.
type convCase struct {
	name                           string
	batch, inChannels, outChannels int
	spatial                        []int // Input spatial dimensions.
	kernel                         []int // Kernel spatial dimensions.
	channelsFirst                  bool
	stride                         int
	padSame                        bool
	dilation                       int
}

func (c convCase) shapes() (input, kernel shapes.Shape) {
	input = shapes.Make(dtypes.Float64, c.batch)
	if c.channelsFirst {
		input.Dimensions = append(append(input.Dimensions, c.inChannels), c.spatial...)
		kernel = shapes.Make(dtypes.Float64, append([]int{c.outChannels, c.inChannels}, c.kernel...)...)
	} else {
		input.Dimensions = append(append(input.Dimensions, c.spatial...), c.inChannels)
		kernel = shapes.Make(dtypes.Float64, append(append([]int{}, c.kernel...), c.inChannels, c.outChannels)...)
	}
	return input, kernel
}

// hasEvenDilatedKernel reports whether some spatial axis of the kernel, dilated, has an even size.
func (c convCase) hasEvenDilatedKernel() bool {
	for _, size := range c.kernel {
		if ((size-1)*max(c.dilation, 1)+1)%2 == 0 {
			return true
		}
	}
	return false
}

func (c convCase) convolve(x, kernel *graph.Node) *graph.Node {
	conv := graph.Convolve(x, kernel).Strides(max(c.stride, 1))
	if c.channelsFirst {
		conv.ChannelsAxis(images.ChannelsFirst)
	}
	if c.padSame {
		conv.PadSame()
	} else {
		conv.NoPadding()
	}
	if c.dilation > 1 {
		conv.Dilations(c.dilation)
	}
	return conv.Done()
}

var convCases = []convCase{
	{name: "stride1/valid/last", batch: 2, inChannels: 3, outChannels: 4, spatial: []int{6, 5}, kernel: []int{3, 3}, stride: 1},
	{name: "stride1/same/last", batch: 2, inChannels: 3, outChannels: 4, spatial: []int{6, 5}, kernel: []int{3, 3}, stride: 1, padSame: true},
	{name: "stride1/valid/last/even-kernel", batch: 2, inChannels: 2, outChannels: 3, spatial: []int{5, 6}, kernel: []int{2, 4}, stride: 1},
	{name: "stride1/same/last/even-kernel", batch: 2, inChannels: 2, outChannels: 3, spatial: []int{5, 6}, kernel: []int{2, 2}, stride: 1, padSame: true},
	{name: "stride2/valid/last", batch: 2, inChannels: 2, outChannels: 3, spatial: []int{7, 6}, kernel: []int{3, 3}, stride: 2},
	{name: "stride2/same/last", batch: 2, inChannels: 2, outChannels: 3, spatial: []int{7, 6}, kernel: []int{3, 3}, stride: 2, padSame: true},
	{name: "stride1/same/first", batch: 2, inChannels: 3, outChannels: 2, spatial: []int{5, 6}, kernel: []int{3, 3}, stride: 1, padSame: true, channelsFirst: true},
	{name: "stride2/valid/first", batch: 1, inChannels: 2, outChannels: 3, spatial: []int{7, 8}, kernel: []int{3, 2}, stride: 2, channelsFirst: true},
	{name: "stride2/same/first/even-kernel", batch: 2, inChannels: 2, outChannels: 2, spatial: []int{6, 7}, kernel: []int{2, 4}, stride: 2, padSame: true, channelsFirst: true},
	{name: "dilation2/same/last", batch: 1, inChannels: 2, outChannels: 3, spatial: []int{7, 7}, kernel: []int{3, 3}, dilation: 2, padSame: true},
	{name: "dilation2/valid/first", batch: 2, inChannels: 2, outChannels: 2, spatial: []int{7, 6}, kernel: []int{2, 3}, dilation: 2, channelsFirst: true},
	{name: "1x1/stride2/last", batch: 2, inChannels: 3, outChannels: 2, spatial: []int{5, 4}, kernel: []int{1, 1}, stride: 2},
	{name: "1d/stride1/same", batch: 2, inChannels: 2, outChannels: 3, spatial: []int{9}, kernel: []int{3}, stride: 1, padSame: true},
	{name: "3d/stride2/valid", batch: 1, inChannels: 2, outChannels: 2, spatial: []int{5, 4, 5}, kernel: []int{2, 2, 3}, stride: 2},
	// Input gradients by phases: a phase without taps (kernel 2 < stride 3), sizes not divisible by the stride.
	{name: "stride3/same/last/phases", batch: 2, inChannels: 2, outChannels: 2, spatial: []int{8, 7}, kernel: []int{2, 4}, stride: 3, padSame: true},
	{name: "stride2/same/last/odd-size", batch: 2, inChannels: 3, outChannels: 2, spatial: []int{9, 5}, kernel: []int{3, 3}, stride: 2, padSame: true},
	{name: "1d/stride4/valid", batch: 2, inChannels: 2, outChannels: 3, spatial: []int{11}, kernel: []int{3}, stride: 4},
	// An input shorter than the stride leaves phases without positions: built with the dilated gradient.
	{name: "1d/stride3/shorter-input", batch: 2, inChannels: 2, outChannels: 2, spatial: []int{2}, kernel: []int{1}, stride: 3},
}

// TestConvGradientsMatchFiniteDifferences checks the registered convolution gradients on the pure-Go
// backend against central differences, in float64, in both forms: as convolutions on simplego's own
// ConvGeneral and on convkernel's executor, and as slices and dots.
func TestConvGradientsMatchFiniteDifferences(t *testing.T) {
	t.Run("as-convolutions/simplego", func(t *testing.T) {
		withForm(t, AsConvolutions)
		convkernel.Uninstall()
		checkConvGradients(t, computetest.PureGo(t), 1)
	})
	t.Run("as-convolutions/convkernel", func(t *testing.T) {
		withForm(t, AsConvolutions)
		require.NoError(t, convkernel.Install())
		t.Cleanup(convkernel.Uninstall)
		before := convkernel.Calls().Convolutions
		checkConvGradients(t, convkernel.Extend(computetest.PureGo(t)), 3)
		require.Greater(t, convkernel.Calls().Convolutions, before, "no convolution ran on the kernel")
	})
	t.Run("as-slices", func(t *testing.T) {
		withForm(t, AsSlices)
		checkConvGradients(t, computetest.PureGo(t), 1)
	})
}

// withForm sets the gradient form for one test and restores the previous one after it.
func withForm(t *testing.T, form Form) {
	previous := CurrentForm()
	SetForm(form)
	t.Cleanup(func() { SetForm(previous) })
}

// checkConvGradients compares every convCase's registered gradients on backend with central differences;
// seed picks the random operands.
func checkConvGradients(t *testing.T, backend backends.Backend, seed uint64) {
	patch.With(true, func() {
		for i, c := range convCases {
			t.Run(c.name, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(i), seed))
				inputShape, kernelShape := c.shapes()
				inputs := []*tensors.Tensor{computetest.RandomTensor(rng, inputShape), computetest.RandomTensor(rng, kernelShape)}
				loss := func(nodes []*graph.Node) *graph.Node { return smoothLoss(c.convolve(nodes[0], nodes[1])) }
				got, err := gradients(t, backend, loss, inputs)
				require.NoError(t, err)
				for j := range inputs { // finiteDifferences runs on the inputs themselves: give it local copies.
					inputs[j], err = inputs[j].LocalClone()
					require.NoError(t, err)
				}
				want := finiteDifferences(t, backend, loss, inputs, 1e-3)
				require.LessOrEqual(t, maxRelativeError(t, got, want), 1e-8)
			})
		}
	})
}

// poolCase is a pooling as graph.MaxPool, MinPool, SumPool and MeanPool build them.
type poolCase struct {
	name  string
	input []int // Channels-last unless channelsFirst.
	pool  func(x *graph.Node) *graph.PoolBuilder
	// configure sets window, strides and padding.
	configure     func(p *graph.PoolBuilder) *graph.PoolBuilder
	channelsFirst bool
}

func (c poolCase) apply(x *graph.Node) *graph.Node {
	p := c.pool(x)
	if c.channelsFirst {
		p.ChannelsAxis(images.ChannelsFirst)
	}
	return c.configure(p).Done()
}

var poolCases = []poolCase{
	{name: "max/2x2/non-overlapping", input: []int{2, 6, 4, 3}, pool: graph.MaxPool,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.Window(2) }},
	{name: "max/2x2/odd-sizes-cropped", input: []int{2, 7, 5, 2}, pool: graph.MaxPool,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.Window(2) }},
	{name: "max/2x2/padded", input: []int{1, 5, 5, 2}, pool: graph.MaxPool,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder {
			return p.Window(2).PaddingPerDim([][2]int{{1, 0}, {0, 1}})
		}},
	{name: "max/3x3/stride2/overlapping", input: []int{2, 7, 6, 2}, pool: graph.MaxPool,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.Window(3).Strides(2) }},
	{name: "max/3x3/same", input: []int{1, 5, 6, 2}, pool: graph.MaxPool,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.Window(3).PadSame() }},
	{name: "max/2x2/channels-first", input: []int{2, 3, 6, 4}, pool: graph.MaxPool, channelsFirst: true,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.Window(2) }},
	{name: "min/2x3/non-overlapping", input: []int{2, 4, 6, 2}, pool: graph.MinPool,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.WindowPerAxis(2, 3) }},
	{name: "min/2x2/stride1", input: []int{1, 4, 5, 2}, pool: graph.MinPool,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.Window(2).Strides(1) }},
	{name: "mean/2x2/non-overlapping", input: []int{2, 6, 4, 3}, pool: graph.MeanPool,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.Window(2) }},
	{name: "mean/3x3/same", input: []int{2, 5, 4, 2}, pool: graph.MeanPool,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.Window(3).PadSame() }},
	{name: "mean/2x2/channels-first/odd", input: []int{1, 2, 5, 7}, pool: graph.MeanPool, channelsFirst: true,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.Window(2) }},
	{name: "sum/2x2/stride3/gaps", input: []int{2, 8, 7, 2}, pool: graph.SumPool,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.Window(2).Strides(3) }},
	{name: "sum/3x2/stride2/overlapping", input: []int{1, 7, 6, 2}, pool: graph.SumPool,
		configure: func(p *graph.PoolBuilder) *graph.PoolBuilder { return p.WindowPerAxis(3, 2).StridePerAxis(2, 1) }},
}

// TestPoolGradientsMatchFiniteDifferences checks the registered pooling gradients on the pure-Go backend
// against central differences, in float64. The random inputs have no ties, and h is far below the gaps
// between values of a window, so max and min stay on the smooth side of their kinks.
func TestPoolGradientsMatchFiniteDifferences(t *testing.T) {
	backend := computetest.PureGo(t)
	patch.With(true, func() {
		for i, c := range poolCases {
			t.Run(c.name, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(i), 2))
				inputs := []*tensors.Tensor{computetest.RandomTensor(rng, shapes.Make(dtypes.Float64, c.input...))}
				loss := func(nodes []*graph.Node) *graph.Node { return smoothLoss(c.apply(nodes[0])) }
				got, err := gradients(t, backend, loss, inputs)
				require.NoError(t, err)
				want := finiteDifferences(t, backend, loss, inputs, 1e-6)
				require.LessOrEqual(t, maxRelativeError(t, got, want), 1e-6)
			})
		}
	})
}
