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
	"github.com/goaccel/goaccel/cpu/internal/convgraph"
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
// GoMLX's own gradient runs as SelectAndScatter, and compares it with convgraph's gradient rule on plain
// simplego (checked against finite differences in its own tests). The random operands have no ties.
func TestPoolGradientsOnExtendedBackend(t *testing.T) {
	convgraph.Register()
	t.Cleanup(convgraph.Unregister)
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

// TestChannelsLast2x2Runs checks the unrolled runs of 2×2 channels-last windows against a direct
// computation, on values drawn from a few levels (so windows hold ties) with some NaNs: the max or min
// propagates NaN, and the gradient goes to the window's first best position before any NaN, as in the
// general loop.
func TestChannelsLast2x2Runs(t *testing.T) {
	// batch, height, width, channels: runs shorter than the vectorised loops' 8 lanes, and longer ones
	// with a tail; the last ones large enough to split their rows over the compute threads.
	for _, dims := range [][]int{{2, 4, 6, 5}, {3, 6, 10, 16}, {1, 4, 14, 3}, {5, 14, 14, 48}, {3, 30, 12, 24}} {
		t.Run(fmt.Sprint(dims), func(t *testing.T) { checkChannelsLast2x2Runs(t, dims) })
	}
}

func checkChannelsLast2x2Runs(t *testing.T, dims []int) {
	tests := []struct {
		name      string
		strides   []int
		selectMax bool
	}{
		{"max, tiling", nil, true},
		{"min, tiling", nil, false},
		{"max, overlapping", []int{1, 1, 1, 1}, true},
		{"min, overlapping", []int{1, 1, 1, 1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := newWindowPlan(dims, []int{1, 2, 2, 1}, tc.strides, nil)
			require.NoError(t, err)
			rng := rand.New(rand.NewPCG(3, 4))
			operand := make([]float32, product(dims))
			for i := range operand {
				operand[i] = float32(rng.IntN(3))
				switch rng.IntN(17) {
				case 0:
					operand[i] = float32(math.NaN())
				case 1:
					operand[i] = float32(math.Copysign(0, -1)) // ties with +0 the max rule must break as Go does
				}
			}
			reduction := backends.ReduceOpMax
			sign := float32(1)
			if !tc.selectMax {
				reduction, sign = backends.ReduceOpMin, -1
			}
			pooled := make([]float32, product(plan.outputDims))
			reduceWindows(plan, reduction, operand, pooled)
			var wantGradient []float32
			if tc.strides == nil {
				wantGradient = make([]float32, len(operand))
			}
			index := 0
			_, height, width, channels := plan.outputDims[0], plan.outputDims[1], plan.outputDims[2], plan.outputDims[3]
			stride := 2
			if tc.strides != nil {
				stride = 1
			}
			for b := range plan.outputDims[0] {
				for i := range height {
					for j := range width {
						for c := range channels {
							var window [4]int
							for k, d := range [4][2]int{{0, 0}, {0, 1}, {1, 0}, {1, 1}} {
								window[k] = ((b*dims[1]+i*stride+d[0])*dims[2]+j*stride+d[1])*dims[3] + c
							}
							best, chosen, nan := sign*operand[window[0]], 0, false
							for k, at := range window {
								v := sign * operand[at]
								nan = nan || v != v
								if v > best {
									chosen = k
								}
								best = max(best, v) // a NaN, once met, wins the window: nothing after it is larger
							}
							if nan {
								assert.True(t, math.IsNaN(float64(pooled[index])), "window %d holds a NaN", index)
							} else {
								assert.Equal(t, sign*best, pooled[index], "window %d", index)
							}
							if wantGradient != nil {
								wantGradient[window[chosen]] = float32(index + 1)
							}
							index++
						}
					}
				}
			}
			if wantGradient == nil {
				return
			}
			source := make([]float32, len(pooled))
			for i := range source {
				source[i] = float32(i + 1)
			}
			gradient := make([]float32, len(operand))
			for i := range gradient {
				gradient[i] = -1 // every element must be written
			}
			selectAndScatter(plan, tc.selectMax, operand, source, gradient)
			assert.Equal(t, wantGradient, gradient)
		})
	}
}
