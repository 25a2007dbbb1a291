package convgraph

import (
	"math/rand/v2"
	"reflect"
	"sync"
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

// vjpPointer identifies a graph.VJP function, which Go cannot compare with ==.
func vjpPointer(vjp graph.VJP) uintptr { return reflect.ValueOf(vjp).Pointer() }

func TestRegisterUnregister(t *testing.T) {
	Unregister()
	defer Unregister()
	originals := map[graph.NodeType]uintptr{}
	for nodeType := range patch.VJPs {
		originals[nodeType] = vjpPointer(graph.VJPRegistration[nodeType])
	}
	require.False(t, Registered())

	// Concurrent and repeated calls install the VJPs once: a second install would wrap our own VJP and
	// lose GoMLX's for Unregister.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(Register)
	}
	wg.Wait()
	Register()
	require.True(t, Registered())
	for nodeType, original := range originals {
		assert.NotEqual(t, original, vjpPointer(graph.VJPRegistration[nodeType]), "%s", nodeType)
		assert.Equal(t, original, vjpPointer(patch.Replaced(nodeType)), "%s", nodeType)
	}

	Unregister()
	Unregister()
	require.False(t, Registered())
	for nodeType, original := range originals {
		assert.Equal(t, original, vjpPointer(graph.VJPRegistration[nodeType]), "%s", nodeType)
	}
}

// convGradientOnPureGo differentiates a small stride-1 convolution on the pure-Go backend.
func convGradientOnPureGo(t *testing.T) error {
	c := convCases[0]
	rng := rand.New(rand.NewPCG(7, 7))
	inputShape, kernelShape := c.shapes()
	inputs := []*tensors.Tensor{computetest.RandomTensor(rng, inputShape), computetest.RandomTensor(rng, kernelShape)}
	_, err := gradients(t, computetest.PureGo(t), func(nodes []*graph.Node) *graph.Node {
		return smoothLoss(c.convolve(nodes[0], nodes[1]))
	}, inputs)
	return err
}

// TestWithoutRegisterConvGradientFails is the negative control: GoMLX's own convolution gradient does not run
// on the pure-Go backend, and Register is what makes it run.
func TestWithoutRegisterConvGradientFails(t *testing.T) {
	patch.With(false, func() {
		err := convGradientOnPureGo(t)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `"Reverse"`)
	})
	patch.With(true, func() {
		require.NoError(t, convGradientOnPureGo(t))
	})
}

// TestWithoutRegisterPoolGradientsFail is the negative control for pooling: max pooling's gradient needs
// SelectAndScatter and mean pooling's needs Pad, neither of which the pure-Go backend has.
func TestWithoutRegisterPoolGradientsFail(t *testing.T) {
	for _, c := range []struct {
		name, missingOp string
		pool            func(x *graph.Node) *graph.Node
	}{
		{"max", "SelectAndScatterMax", func(x *graph.Node) *graph.Node { return graph.MaxPool(x).Window(2).Done() }},
		{"mean", "Pad", func(x *graph.Node) *graph.Node { return graph.MeanPool(x).Window(2).Done() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(8, 8))
			inputs := []*tensors.Tensor{computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, 2, 4, 4, 3))}
			loss := func(nodes []*graph.Node) *graph.Node { return smoothLoss(c.pool(nodes[0])) }
			patch.With(false, func() {
				_, err := gradients(t, computetest.PureGo(t), loss, inputs)
				require.Error(t, err)
				assert.Contains(t, err.Error(), c.missingOp)
			})
			patch.With(true, func() {
				_, err := gradients(t, computetest.PureGo(t), loss, inputs)
				require.NoError(t, err)
			})
		})
	}
}

// TestUnsupportedFallsBackToGoMLX checks that configurations this package leaves alone reach GoMLX's VJP:
// on the pure-Go backend they then fail the way GoMLX's VJP does.
func TestUnsupportedFallsBackToGoMLX(t *testing.T) {
	for _, c := range []struct {
		name    string
		input   shapes.Shape
		extra   []shapes.Shape // Further inputs.
		fn      func(nodes []*graph.Node) *graph.Node
		wantErr string
	}{
		{
			name: "conv/channel-groups", input: shapes.Make(dtypes.Float64, 2, 5, 5, 4),
			extra: []shapes.Shape{shapes.Make(dtypes.Float64, 3, 3, 2, 4)},
			fn: func(nodes []*graph.Node) *graph.Node {
				return graph.Convolve(nodes[0], nodes[1]).Strides(1).ChannelGroupCount(2).Done()
			},
			wantErr: `"Reverse"`,
		},
		{
			name: "pool/window-dilations", input: shapes.Make(dtypes.Float64, 1, 7, 7, 2),
			fn: func(nodes []*graph.Node) *graph.Node {
				return graph.BackendReduceWindow(nodes[0], backends.ReduceOpMax, []int{1, 2, 2, 1}, []int{1, 1, 1, 1},
					nil, []int{1, 2, 2, 1}, nil)
			},
			wantErr: "dilations is not defined",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(9, 9))
			inputs := []*tensors.Tensor{computetest.RandomTensor(rng, c.input)}
			for _, shape := range c.extra {
				inputs = append(inputs, computetest.RandomTensor(rng, shape))
			}
			patch.With(true, func() {
				_, err := gradients(t, computetest.PureGo(t), func(nodes []*graph.Node) *graph.Node {
					return smoothLoss(c.fn(nodes))
				}, inputs)
				require.Error(t, err)
				assert.Contains(t, err.Error(), c.wantErr)
			})
		})
	}
}

// TestMaxPoolTiesGoToFirst checks that among equal maxima of a window the whole gradient goes to the first in
// row-major order, on both the non-overlapping and the general path.
func TestMaxPoolTiesGoToFirst(t *testing.T) {
	backend := computetest.PureGo(t)
	for _, c := range []struct {
		name string
		pool func(x *graph.Node) *graph.Node
		want [][]float64 // Gradient of the sum of the pooled values, for a 4×4 input of ones.
	}{
		{"2x2/non-overlapping", func(x *graph.Node) *graph.Node { return graph.MaxPool(x).Window(2).Done() },
			[][]float64{{1, 0, 1, 0}, {0, 0, 0, 0}, {1, 0, 1, 0}, {0, 0, 0, 0}}},
		{"2x2/stride1", func(x *graph.Node) *graph.Node { return graph.MaxPool(x).Window(2).Strides(1).Done() },
			[][]float64{{1, 1, 1, 0}, {1, 1, 1, 0}, {1, 1, 1, 0}, {0, 0, 0, 0}}},
		{"3x3/same", func(x *graph.Node) *graph.Node { return graph.MaxPool(x).Window(3).PadSame().Done() },
			// Padding never takes a gradient: each output's first real position in its window does, the
			// top-left one of the window clipped to the input.
			[][]float64{{4, 2, 2, 0}, {2, 1, 1, 0}, {2, 1, 1, 0}, {0, 0, 0, 0}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ones := tensors.FromFlatDataAndDimensions(make([]float64, 16), 1, 4, 4, 1)
			tensors.MutableFlatData(ones, func(flat []float64) {
				for i := range flat {
					flat[i] = 1
				}
			})
			patch.With(true, func() {
				got, err := gradients(t, backend, func(nodes []*graph.Node) *graph.Node {
					return graph.ReduceAllSum(c.pool(nodes[0]))
				}, []*tensors.Tensor{ones})
				require.NoError(t, err)
				want := make([]float64, 0, 16)
				for _, row := range c.want {
					want = append(want, row...)
				}
				assert.Equal(t, want, tensors.MustCopyFlatData[float64](got[0]))
			})
		})
	}
}
