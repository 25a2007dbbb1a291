package extraops_test

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/cpu/internal/computetest"
	_ "github.com/goaccel/goaccel/cpu/kernels"
)

func TestMain(m *testing.M) { computetest.Main(m) }

// newBackend is the pure-Go backend with goaccel's kernels, as cpu.New makes it.
var newBackend = sync.OnceValues(func() (backends.Backend, error) {
	return cpu.New(cpu.Config{Backend: cpu.PureGo})
})

func pureGo(tb testing.TB) backends.Backend {
	tb.Helper()
	backend, err := newBackend()
	require.NoError(tb, err)
	return backend
}

// run executes fn once on the pure-Go backend and returns its single result.
func run(tb testing.TB, fn func(xs []*graph.Node) *graph.Node, args ...*tensors.Tensor) *tensors.Tensor {
	tb.Helper()
	return runOn(tb, pureGo(tb), fn, args...)
}

// runOn executes fn once on backend and returns its single result.
func runOn(tb testing.TB, backend backends.Backend, fn func(xs []*graph.Node) *graph.Node, args ...*tensors.Tensor) *tensors.Tensor {
	tb.Helper()
	exec, err := graph.NewExec(backend, fn)
	require.NoError(tb, err)
	defer exec.Finalize()
	anyArgs := make([]any, len(args))
	for i, arg := range args {
		anyArgs[i] = arg
	}
	outputs, err := exec.Exec(anyArgs...)
	require.NoError(tb, err)
	require.Len(tb, outputs, 1)
	return outputs[0]
}

// float64s returns a float64 tensor's values.
func float64s(tb testing.TB, t *tensors.Tensor) []float64 {
	tb.Helper()
	values, err := tensors.CopyFlatData[float64](t)
	require.NoError(tb, err)
	return values
}

// randomValues returns n values uniform in [-1, 1).
func randomValues(rng *rand.Rand, n int) []float64 {
	values := make([]float64, n)
	for i := range values {
		values[i] = 2*rng.Float64() - 1
	}
	return values
}

// randomTensor returns a float64 tensor of the given dimensions with values in [-1, 1).
func randomTensor(rng *rand.Rand, dims ...int) *tensors.Tensor {
	return tensors.FromFlatDataAndDimensions(randomValues(rng, shapes.Make(dtypes.Float64, dims...).Size()), dims...)
}

// weights are fixed, distinct, non-trivial multipliers of a result's elements, so that a scalar loss sees
// every one: sin(0.73·i + 0.37).
func weights(g *graph.Graph, shape shapes.Shape) *graph.Node {
	flat := graph.IotaFull(g, shapes.Make(shape.DType, shape.Size()))
	w := graph.Sin(graph.AddScalar(graph.MulScalar(flat, 0.73), 0.37))
	return graph.Reshape(w, shape.Dimensions...)
}

// gradCase is a function checked against central differences: f of its inputs, each float64 (differentiated
// where diff says so) or of another dtype (indices, passed as they are).
type gradCase struct {
	f      func(xs []*graph.Node) *graph.Node
	inputs []*tensors.Tensor
	diff   []bool
	// backend runs the check; nil for pureGo's.
	backend backends.Backend
}

// check compares graph.Gradient of Σ f(xs)·w with central differences of the same loss, in float64, and
// the gradient computed in float32 with those differences.
func (c gradCase) check(t *testing.T) {
	t.Helper()
	backend := c.backend
	if backend == nil {
		backend = pureGo(t)
	}
	loss := func(xs []*graph.Node) *graph.Node {
		y := c.f(xs)
		return graph.ReduceAllSum(graph.Mul(y, weights(y.Graph(), y.Shape())))
	}
	gradients := func(xs []*graph.Node) []*graph.Node {
		var wrt []*graph.Node
		for i, x := range xs {
			if c.diff[i] {
				wrt = append(wrt, x)
			}
		}
		return graph.Gradient(loss(xs), wrt...)
	}
	lossExec, err := graph.NewExec(backend, loss)
	require.NoError(t, err)
	defer lossExec.Finalize()
	gradExec, err := graph.NewExec(backend, gradients)
	require.NoError(t, err)
	defer gradExec.Finalize()
	execute := func(e *graph.Exec, inputs []*tensors.Tensor) []*tensors.Tensor {
		args := make([]any, len(inputs))
		for i, input := range inputs {
			args[i] = input
		}
		outputs, err := e.Exec(args...)
		require.NoError(t, err)
		return outputs
	}

	// Central differences, in float64.
	values := make([][]float64, len(c.inputs))
	for i, input := range c.inputs {
		if c.diff[i] {
			values[i] = float64s(t, input)
		}
	}
	numeric := make([][]float64, 0, len(c.inputs))
	for i, input := range c.inputs {
		if !c.diff[i] {
			continue
		}
		dims := input.Shape().Dimensions
		grad := make([]float64, len(values[i]))
		for k, v := range values[i] {
			h := 1e-5 * max(1, math.Abs(v))
			at := func(x float64) float64 {
				perturbed := append([]float64(nil), values[i]...)
				perturbed[k] = x
				inputs := append([]*tensors.Tensor(nil), c.inputs...)
				inputs[i] = tensors.FromFlatDataAndDimensions(perturbed, dims...)
				return tensors.ToScalar[float64](execute(lossExec, inputs)[0])
			}
			grad[k] = (at(v+h) - at(v-h)) / (2 * h)
		}
		numeric = append(numeric, grad)
	}

	// graph.Gradient in float64 and in float32.
	for _, dtype := range []dtypes.DType{dtypes.Float64, dtypes.Float32} {
		inputs := make([]*tensors.Tensor, len(c.inputs))
		for i, input := range c.inputs {
			inputs[i] = input
			if input.DType() == dtypes.Float64 && dtype == dtypes.Float32 {
				inputs[i] = toFloat32(t, input)
			}
		}
		tolerance := 1e-6
		if dtype == dtypes.Float32 {
			tolerance = 2e-3
		}
		for j, output := range execute(gradExec, inputs) {
			var got []float64
			if dtype == dtypes.Float32 {
				got32, err := tensors.CopyFlatData[float32](output)
				require.NoError(t, err)
				for _, v := range got32 {
					got = append(got, float64(v))
				}
			} else {
				got = float64s(t, output)
			}
			require.Len(t, got, len(numeric[j]))
			for k := range got {
				require.InDelta(t, numeric[j][k], got[k], tolerance*(1+math.Abs(numeric[j][k])),
					"%s gradient #%d, element %d", dtype, j, k)
			}
		}
	}
}

func toFloat32(tb testing.TB, t *tensors.Tensor) *tensors.Tensor {
	values := float64s(tb, t)
	converted := make([]float32, len(values))
	for i, v := range values {
		converted[i] = float32(v)
	}
	return tensors.FromFlatDataAndDimensions(converted, t.Shape().Dimensions...)
}

// castTo converts x to dtype inside a graph; float64 to Bool compares with 0.
func castTo(x *graph.Node, dtype dtypes.DType) *graph.Node {
	if dtype == dtypes.Bool {
		return graph.NotEqual(x, graph.ScalarZero(x.Graph(), x.DType()))
	}
	return graph.ConvertDType(x, dtype)
}

// fromDType converts x back to float64 (booleans as 0 and 1).
func fromDType(x *graph.Node) *graph.Node {
	return graph.ConvertDType(x, dtypes.Float64)
}

// movedDTypes are the dtypes the data-moving ops are tested in (every element size).
var movedDTypes = []dtypes.DType{dtypes.Float64, dtypes.Float32, dtypes.BFloat16, dtypes.Int8, dtypes.Int32,
	dtypes.Int64, dtypes.Uint16, dtypes.Bool}

// smallInts returns n integers in [-4, 4] as float64 (0 or 1 for booleans): exact in every dtype.
func smallInts(rng *rand.Rand, n int, dtype dtypes.DType) []float64 {
	values := make([]float64, n)
	for i := range values {
		if dtype == dtypes.Bool {
			values[i] = float64(rng.IntN(2))
		} else if dtype.IsUnsigned() {
			values[i] = float64(rng.IntN(9))
		} else {
			values[i] = float64(rng.IntN(9) - 4)
		}
	}
	return values
}

// strides returns the row-major strides of dims.
func strides(dims []int) []int {
	s := make([]int, len(dims))
	step := 1
	for a := len(dims) - 1; a >= 0; a-- {
		s[a] = step
		step *= dims[a]
	}
	return s
}

// forEachIndex calls fn with every multi-index of dims, in row-major order.
func forEachIndex(dims []int, fn func(index []int)) {
	size := 1
	for _, d := range dims {
		size *= d
	}
	index := make([]int, len(dims))
	for range size {
		fn(index)
		for a := len(dims) - 1; a >= 0; a-- {
			index[a]++
			if index[a] < dims[a] {
				break
			}
			index[a] = 0
		}
	}
}

func flatIndex(index, strides []int) int {
	flat := 0
	for a, i := range index {
		flat += i * strides[a]
	}
	return flat
}
