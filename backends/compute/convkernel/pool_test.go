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

	"github.com/goaccel/goaccel/backends/compute/convgrad"
	"github.com/goaccel/goaccel/backends/compute/internal/computetest"
)

// poolConfig is one ReduceWindow as the backend receives it.
type poolConfig struct {
	dims, window, strides []int
	paddings              [][2]int
	reduction             backends.ReduceOpType
}

func (c poolConfig) String() string {
	return fmt.Sprintf("%s/x%v/w%v/s%v/p%v", c.reduction, c.dims, c.window, c.strides, c.paddings)
}

// randomPoolConfig draws a pooling over 3 or 4 axes with windows of 1–3, strides of 1–3 (tiling,
// overlapping or leaving gaps) and padding of 0–1 on either side.
func randomPoolConfig(rng *rand.Rand) poolConfig {
	rank := 3 + rng.IntN(2)
	c := poolConfig{reduction: []backends.ReduceOpType{backends.ReduceOpMax, backends.ReduceOpMin, backends.ReduceOpSum}[rng.IntN(3)]}
	for range rank {
		w := 1 + rng.IntN(3)
		c.window = append(c.window, w)
		c.strides = append(c.strides, 1+rng.IntN(3))
		c.paddings = append(c.paddings, [2]int{rng.IntN(2) * rng.IntN(2), rng.IntN(2) * rng.IntN(2)})
		c.dims = append(c.dims, w+rng.IntN(5))
	}
	if rng.IntN(3) == 0 { // Tiling windows: the default strides, no padding, sizes that divide.
		c.strides, c.paddings = nil, nil
		for axis := range c.dims {
			c.dims[axis] = c.window[axis] * (1 + rng.IntN(3))
		}
	}
	return c
}

// TestReduceWindowMatchesSimplego compares the window walk with simplego's own ReduceWindow, with NaN in
// the operand half the time.
func TestReduceWindowMatchesSimplego(t *testing.T) {
	withKernels(t, true, func() {})
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 80 {
		c := randomPoolConfig(rng)
		for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64} {
			t.Run(fmt.Sprintf("%d/%s/%s", i, c, dtype), func(t *testing.T) {
				x := computetest.RandomTensor(rng, shapes.Make(dtype, c.dims...))
				if i%2 == 1 {
					x = withNaN(t, x, i)
				}
				pool := func(x *graph.Node) *graph.Node {
					return graph.BackendReduceWindow(x, c.reduction, c.window, c.strides, nil, nil, c.paddings)
				}
				var got, want *tensors.Tensor
				withKernels(t, true, func() {
					before := Calls().Pools
					got = graph.MustExecOnce(computetest.PureGo(t), pool, x)
					assert.Equal(t, before+1, Calls().Pools)
				})
				withKernels(t, false, func() { want = graph.MustExecOnce(computetest.PureGo(t), pool, x) })
				assertClose(t, flat64(got), flat64(want), 1e-6)
			})
		}
	}
}

// withNaN returns a copy of x with a NaN at one element.
func withNaN(t *testing.T, x *tensors.Tensor, seed int) *tensors.Tensor {
	t.Helper()
	out, err := x.LocalClone()
	require.NoError(t, err)
	at := seed * 7919 % out.Shape().Size()
	if out.DType() == dtypes.Float32 {
		tensors.MustMutableFlatData[float32](out, func(flat []float32) { flat[at] = float32(math.NaN()) })
	} else {
		tensors.MustMutableFlatData[float64](out, func(flat []float64) { flat[at] = math.NaN() })
	}
	return out
}

// TestPoolGradientsOnExtendedBackend differentiates max and min pooling on the extended backend, where
// GoMLX's own gradient runs as SelectAndScatter, and compares it with convgrad's gradient rule on plain
// simplego (checked against finite differences in its own tests). The random operands have no ties.
func TestPoolGradientsOnExtendedBackend(t *testing.T) {
	convgrad.Register()
	t.Cleanup(convgrad.Unregister)
	extended := Extend(computetest.PureGo(t))
	rng := rand.New(rand.NewPCG(9, 10))
	for i := range 40 {
		c := randomPoolConfig(rng)
		if c.reduction == backends.ReduceOpSum {
			c.reduction = backends.ReduceOpMax
		}
		if i%4 == 0 {
			c.reduction = backends.ReduceOpMin
		}
		for _, dtype := range []dtypes.DType{dtypes.Float32, dtypes.Float64} {
			t.Run(fmt.Sprintf("%d/%s/%s", i, c, dtype), func(t *testing.T) {
				x := computetest.RandomTensor(rng, shapes.Make(dtype, c.dims...))
				gradient := func(x *graph.Node) *graph.Node {
					pooled := graph.BackendReduceWindow(x, c.reduction, c.window, c.strides, nil, nil, c.paddings)
					weights := graph.Cos(graph.MulScalar(graph.IotaFull(x.Graph(), pooled.Shape()), 0.37))
					return graph.Gradient(graph.ReduceAllSum(graph.Mul(pooled, weights)), x)[0]
				}
				var got *tensors.Tensor
				withKernels(t, true, func() {
					local, err := x.LocalClone()
					require.NoError(t, err)
					before := Calls().Scatters
					got = graph.MustExecOnce(extended, gradient, local)
					if c.strides != nil { // GoMLX's rule (a SelectAndScatter) needs explicit strides.
						assert.Equal(t, before+1, Calls().Scatters, "the gradient did not run as a SelectAndScatter")
					}
				})
				local, err := x.LocalClone()
				require.NoError(t, err)
				want := graph.MustExecOnce(computetest.PureGo(t), gradient, local)
				assertClose(t, flat64(got), flat64(want), 1e-6)
			})
		}
	}
}
