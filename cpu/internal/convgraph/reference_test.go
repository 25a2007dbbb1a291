package convgraph

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
)

// referenceBackend wraps the pure-Go backend so that GoMLX's own convolution gradient runs on it, as a
// reference for this package's: its builders implement Reverse, which simplego lacks, and default the
// strides of ConvGeneral to 1, which GoMLX's gradient leaves nil and simplego's shape inference then reads
// as 0.
type referenceBackend struct{ backends.Backend }

func (b referenceBackend) Builder(name string) backends.Builder {
	return referenceBuilder{b.Backend.Builder(name)}
}

type referenceBuilder struct{ backends.Builder }

// Reverse reverses each axis as one single-element Slice per index, concatenated backwards.
func (b referenceBuilder) Reverse(x backends.Op, axes ...int) (backends.Op, error) {
	for _, axis := range axes {
		shape, err := b.OpShape(x)
		if err != nil {
			return nil, err
		}
		dim := shape.Dimensions[axis]
		reversed := make([]backends.Op, 0, dim)
		for i := dim - 1; i >= 0; i-- {
			starts, limits, strides := make([]int, shape.Rank()), slices.Clone(shape.Dimensions), make([]int, shape.Rank())
			for a := range strides {
				strides[a] = 1
			}
			starts[axis], limits[axis] = i, i+1
			element, err := b.Slice(x, starts, limits, strides)
			if err != nil {
				return nil, err
			}
			reversed = append(reversed, element)
		}
		if x, err = b.Concatenate(axis, reversed...); err != nil {
			return nil, err
		}
	}
	return x, nil
}

func (b referenceBuilder) ConvGeneral(input, kernel backends.Op, axes backends.ConvolveAxesConfig,
	strides []int, paddings [][2]int, inputDilations, kernelDilations []int,
	channelGroupCount, batchGroupCount int) (backends.Op, error) {
	strides, kernelDilations = onesIfNil(strides, len(axes.InputSpatial)), onesIfNil(kernelDilations, len(axes.InputSpatial))
	return b.Builder.ConvGeneral(input, kernel, axes, strides, paddings, inputDilations, kernelDilations,
		channelGroupCount, batchGroupCount)
}

func onesIfNil(values []int, n int) []int {
	if values != nil {
		return values
	}
	values = make([]int, n)
	for i := range values {
		values[i] = 1
	}
	return values
}

// TestConvGradientsMatchGoMLX compares the registered convolution gradients with GoMLX's own, run on the
// pure-Go backend given what they miss there (see referenceBackend). GoMLX v0.26.0's input gradient is off
// by one position when the dilated kernel has an even size (its reverse convolution pads by
// (size-1)/2 twice where size-1 is needed), so for those only the kernel gradients are compared; the
// finite-difference tests show this package's input gradients are right there too.
func TestConvGradientsMatchGoMLX(t *testing.T) {
	backend := computetest.PureGo(t)
	reference := referenceBackend{backend}
	for i, c := range convCases {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			inputShape, kernelShape := c.shapes()
			inputs := []*tensors.Tensor{computetest.RandomTensor(rng, inputShape), computetest.RandomTensor(rng, kernelShape)}
			loss := func(nodes []*graph.Node) *graph.Node { return smoothLoss(c.convolve(nodes[0], nodes[1])) }
			var got, want []*tensors.Tensor
			var err error
			patch.With(true, func() { got, err = gradients(t, backend, loss, inputs) })
			require.NoError(t, err)
			patch.With(false, func() { want, err = gradients(t, reference, loss, inputs) })
			require.NoError(t, err)
			const inputGradient, kernelGradient = 0, 1
			compared := []int{inputGradient, kernelGradient}
			if c.hasEvenDilatedKernel() {
				compared = []int{kernelGradient}
			}
			for _, j := range compared {
				require.InDeltaSlice(t, tensors.MustCopyFlatData[float64](want[j]),
					tensors.MustCopyFlatData[float64](got[j]), 1e-12, "gradient %d", j)
			}
		})
	}
}
