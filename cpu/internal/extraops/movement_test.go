package extraops_test

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

	"github.com/goaccel/goaccel/cpu/internal/extraops"
)

// refPad is XLA's Pad computed element by element: each operand element goes to Start + i·(Interior+1) on
// every axis, if that is inside the output.
func refPad(values []float64, dims []int, fill float64, config []backends.PadAxis) ([]float64, []int) {
	outDims := make([]int, len(dims))
	full := make([]backends.PadAxis, len(dims))
	copy(full, config)
	size := 1
	for a, d := range dims {
		outDims[a] = full[a].Start + full[a].End + d + max(d-1, 0)*full[a].Interior
		size *= outDims[a]
	}
	out := make([]float64, size)
	for i := range out {
		out[i] = fill
	}
	inStrides, outStrides := strides(dims), strides(outDims)
	forEachIndex(dims, func(index []int) {
		target := 0
		for a, i := range index {
			o := full[a].Start + i*(full[a].Interior+1)
			if o < 0 || o >= outDims[a] {
				return
			}
			target += o * outStrides[a]
		}
		out[target] = values[flatIndex(index, inStrides)]
	})
	return out, outDims
}

func refReverse(values []float64, dims []int, axes []int) []float64 {
	out := make([]float64, len(values))
	s := strides(dims)
	forEachIndex(dims, func(index []int) {
		source := append([]int(nil), index...)
		for _, a := range axes {
			source[a] = dims[a] - 1 - index[a]
		}
		out[flatIndex(index, s)] = values[flatIndex(source, s)]
	})
	return out
}

// clamp is XLA's adjustment of a dynamic start index.
func clamp(start int64, dim, size int) int {
	return int(min(max(start, 0), int64(dim-size)))
}

func refDynamicSlice(values []float64, dims []int, starts []int64, sizes []int) []float64 {
	var out []float64
	s := strides(dims)
	forEachIndex(sizes, func(index []int) {
		source := make([]int, len(index))
		for a, i := range index {
			source[a] = clamp(starts[a], dims[a], sizes[a]) + i
		}
		out = append(out, values[flatIndex(source, s)])
	})
	return out
}

func refDynamicUpdateSlice(values []float64, dims []int, update []float64, updateDims []int, starts []int64) []float64 {
	out := append([]float64(nil), values...)
	s, us := strides(dims), strides(updateDims)
	forEachIndex(updateDims, func(index []int) {
		target := make([]int, len(index))
		for a, i := range index {
			target[a] = clamp(starts[a], dims[a], updateDims[a]) + i
		}
		out[flatIndex(target, s)] = update[flatIndex(index, us)]
	})
	return out
}

// TestPadByHand: XLA's examples of Pad, edge, interior and negative.
func TestPadByHand(t *testing.T) {
	x := tensors.FromValue([][]float32{{1, 2, 3}, {4, 5, 6}})
	for _, tc := range []struct {
		name   string
		config []backends.PadAxis
		want   any
	}{
		{"none", nil, [][]float32{{1, 2, 3}, {4, 5, 6}}},
		{"edges", []backends.PadAxis{{Start: 1}, {End: 2}}, [][]float32{{0, 0, 0, 0, 0}, {1, 2, 3, 0, 0}, {4, 5, 6, 0, 0}}},
		{"interior", []backends.PadAxis{{}, {Interior: 1}}, [][]float32{{1, 0, 2, 0, 3}, {4, 0, 5, 0, 6}}},
		{"negative", []backends.PadAxis{{Start: -1}, {Start: 1, End: -2}}, [][]float32{{0, 4}}},
		{"negative over interior", []backends.PadAxis{{End: 1, Interior: 1}, {Start: -1, Interior: 2}},
			[][]float32{{0, 0, 2, 0, 0, 3}, {0, 0, 0, 0, 0, 0}, {0, 0, 5, 0, 0, 6}, {0, 0, 0, 0, 0, 0}}},
		{"cropped to nothing", []backends.PadAxis{{Start: -2}}, [][]float32{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, func(xs []*graph.Node) *graph.Node {
				return graph.Pad(xs[0], graph.ScalarZero(xs[0].Graph(), dtypes.Float32), tc.config...)
			}, x)
			if want, ok := tc.want.([][]float32); ok && len(want) == 0 {
				assert.Equal(t, 0, got.Shape().Size())
				assert.Equal(t, []int{0, 3}, got.Shape().Dimensions)
				return
			}
			assert.Equal(t, tc.want, got.Value())
		})
	}
}

// randomPadConfig returns a padding of dims that leaves no negative dimension.
func randomPadConfig(rng *rand.Rand, dims []int) []backends.PadAxis {
	config := make([]backends.PadAxis, rng.IntN(len(dims)+1))
	for a := range config {
		d := dims[a]
		for {
			c := backends.PadAxis{Start: rng.IntN(7) - 3, End: rng.IntN(7) - 3, Interior: rng.IntN(3)}
			if c.Start+c.End+d+max(d-1, 0)*c.Interior >= 0 {
				config[a] = c
				break
			}
		}
	}
	return config
}

func randomDims(rng *rand.Rand, maxRank int) []int {
	dims := make([]int, rng.IntN(maxRank+1))
	for a := range dims {
		dims[a] = rng.IntN(6) // Zero-size axes included.
	}
	return dims
}

// TestMovementOps compares Pad, Reverse, DynamicSlice and DynamicUpdateSlice with the element-by-element
// references above, on random shapes (zero-size axes included), in dtypes of every element size.
func TestMovementOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dtype := range movedDTypes {
		for trial := range 16 {
			dims := randomDims(rng, 4)
			size := 1
			for _, d := range dims {
				size *= d
			}
			values := smallInts(rng, size, dtype)
			x := tensors.FromFlatDataAndDimensions(values, dims...)
			if len(dims) == 0 {
				x = tensors.FromScalar(values[0])
			}
			t.Run(fmt.Sprintf("%s/%d/%v", dtype, trial, dims), func(t *testing.T) {
				config := randomPadConfig(rng, dims)
				fillValue := smallInts(rng, 1, dtype)[0]
				want, wantDims := refPad(values, dims, fillValue, config)
				got := run(t, func(xs []*graph.Node) *graph.Node {
					fill := castTo(graph.Scalar(xs[0].Graph(), dtypes.Float64, fillValue), dtype)
					return fromDType(graph.Pad(castTo(xs[0], dtype), fill, config...))
				}, x)
				assertSame(t, wantDims, got.Shape().Dimensions, "Pad %+v", config)
				assertSame(t, want, float64s(t, got), "Pad %+v", config)

				var axes []int
				for a := range dims {
					if rng.IntN(2) == 0 {
						axes = append(axes, a)
					}
				}
				rng.Shuffle(len(axes), func(i, j int) { axes[i], axes[j] = axes[j], axes[i] })
				got = run(t, func(xs []*graph.Node) *graph.Node {
					return fromDType(graph.Reverse(castTo(xs[0], dtype), axes...))
				}, x)
				assertSame(t, refReverse(values, dims, axes), float64s(t, got), "Reverse %v", axes)

				sizes, starts := make([]int, len(dims)), make([]int64, len(dims))
				for a, d := range dims {
					sizes[a] = rng.IntN(d + 1)
					starts[a] = int64(rng.IntN(d+7) - 3) // Out of range on both sides, clamped.
				}
				indexDType := []dtypes.DType{dtypes.Int32, dtypes.Int64, dtypes.Int8, dtypes.Uint32}[trial%4]
				if indexDType.IsUnsigned() {
					for a := range starts {
						starts[a] = max(starts[a], 0)
					}
				}
				indices := func(g *graph.Graph) []*graph.Node {
					nodes := make([]*graph.Node, len(starts))
					for a, s := range starts {
						nodes[a] = graph.Scalar(g, indexDType, s)
					}
					return nodes
				}
				got = run(t, func(xs []*graph.Node) *graph.Node {
					return fromDType(graph.DynamicSlice(castTo(xs[0], dtype), indices(xs[0].Graph()), sizes))
				}, x)
				assertSame(t, refDynamicSlice(values, dims, starts, sizes), float64s(t, got),
					"DynamicSlice at %v of %v", starts, sizes)

				updateValues := smallInts(rng, got.Shape().Size(), dtype)
				update := tensors.FromFlatDataAndDimensions(updateValues, sizes...)
				if len(sizes) == 0 {
					update = tensors.FromScalar(updateValues[0])
				}
				got = run(t, func(xs []*graph.Node) *graph.Node {
					return fromDType(graph.DynamicUpdateSlice(castTo(xs[0], dtype), castTo(xs[1], dtype),
						indices(xs[0].Graph())))
				}, x, update)
				assertSame(t, refDynamicUpdateSlice(values, dims, updateValues, sizes, starts), float64s(t, got),
					"DynamicUpdateSlice at %v of %v", starts, sizes)
			})
		}
	}
}

// TestDynamicSliceIndices: start indices of every integer dtype, one vector or scalars, far out of range.
func TestDynamicSliceIndices(t *testing.T) {
	x := tensors.FromValue([][]float64{{0, 1, 2, 3}, {10, 11, 12, 13}, {20, 21, 22, 23}})
	for _, tc := range []struct {
		dtype      dtypes.DType
		row, col   any
		wantCorner [2]int
	}{
		{dtypes.Int8, int8(-128), int8(127), [2]int{0, 2}},
		{dtypes.Int16, int16(1), int16(-1), [2]int{1, 0}},
		{dtypes.Int32, int32(math.MaxInt32), int32(1), [2]int{1, 1}},
		{dtypes.Int64, int64(math.MinInt64), int64(math.MaxInt64), [2]int{0, 2}},
		{dtypes.Uint8, uint8(255), uint8(0), [2]int{1, 0}},
		{dtypes.Uint16, uint16(1), uint16(2), [2]int{1, 2}},
		{dtypes.Uint32, uint32(math.MaxUint32), uint32(1), [2]int{1, 1}},
		{dtypes.Uint64, uint64(math.MaxUint64), uint64(1), [2]int{1, 1}},
	} {
		t.Run(tc.dtype.String(), func(t *testing.T) {
			want := [][]float64{
				{float64(10*tc.wantCorner[0] + tc.wantCorner[1]), float64(10*tc.wantCorner[0] + tc.wantCorner[1] + 1)},
				{float64(10*tc.wantCorner[0] + tc.wantCorner[1] + 10), float64(10*tc.wantCorner[0] + tc.wantCorner[1] + 11)},
			}
			got := run(t, func(xs []*graph.Node) *graph.Node {
				g := xs[0].Graph()
				return graph.DynamicSlice(xs[0], []*graph.Node{graph.Const(g, tc.row), graph.Const(g, tc.col)}, []int{2, 2})
			}, x)
			assert.Equal(t, want, got.Value(), "scalar indices")
			got = run(t, func(xs []*graph.Node) *graph.Node {
				g := xs[0].Graph()
				vector := graph.Concatenate([]*graph.Node{graph.Reshape(graph.Const(g, tc.row), 1),
					graph.Reshape(graph.Const(g, tc.col), 1)}, 0)
				return graph.DynamicSlice(xs[0], []*graph.Node{vector}, []int{2, 2})
			}, x)
			assert.Equal(t, want, got.Value(), "one vector of indices")
		})
	}
}

// TestBuilderRejects: what XLA rejects fails when the graph is built, with the op named.
func TestBuilderRejects(t *testing.T) {
	backend := pureGo(t)
	for name, build := range map[string]func(g *graph.Graph){
		"Pad with negative interior": func(g *graph.Graph) {
			graph.Pad(graph.Zeros(g, f32(3)), graph.ScalarZero(g, dtypes.Float32), backends.PadAxis{Interior: -1})
		},
		"Pad to a negative dimension": func(g *graph.Graph) {
			graph.Pad(graph.Zeros(g, f32(3)), graph.ScalarZero(g, dtypes.Float32), backends.PadAxis{Start: -2, End: -2})
		},
		"Pad with a fill of another dtype": func(g *graph.Graph) {
			graph.Pad(graph.Zeros(g, f32(3)), graph.ScalarZero(g, dtypes.Float64))
		},
		"DynamicSlice larger than its operand": func(g *graph.Graph) {
			graph.DynamicSlice(graph.Zeros(g, f32(3)), []*graph.Node{graph.Const(g, int32(0))}, []int{4})
		},
		"DynamicSlice with float indices": func(g *graph.Graph) {
			graph.DynamicSlice(graph.Zeros(g, f32(3)), []*graph.Node{graph.Const(g, float32(0))}, []int{1})
		},
		"DynamicUpdateSlice with too few indices": func(g *graph.Graph) {
			graph.DynamicUpdateSlice(graph.Zeros(g, f32(3, 3)), graph.Zeros(g, f32(1, 1)),
				[]*graph.Node{graph.Const(g, int32(0))})
		},
		"Reverse of a repeated axis": func(g *graph.Graph) {
			graph.Reverse(graph.Zeros(g, f32(3, 3)), 1, 1)
		},
		"batch normalization of integers": func(g *graph.Graph) {
			x := graph.Zeros(g, shapes.Make(dtypes.Int32, 2, 3))
			f := graph.Zeros(g, shapes.Make(dtypes.Int32, 3))
			graph.InternalBatchNormForInference(x, f, f, f, f, 1e-3, 1)
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := graph.NewGraph(backend, "rejects")
			defer g.Finalize()
			require.Panics(t, func() { build(g) })
		})
	}
}

// TestCapabilities: the backend cpu.New makes lists the added ops, and they ran through this package.
func TestCapabilities(t *testing.T) {
	capabilities := pureGo(t).Capabilities()
	for _, op := range []backends.OpType{backends.OpTypePad, backends.OpTypeReverse, backends.OpTypeDynamicSlice,
		backends.OpTypeDynamicUpdateSlice, backends.OpTypeBatchNormForTraining, backends.OpTypeBatchNormForInference,
		backends.OpTypeBatchNormGradient} {
		assert.True(t, capabilities.Operations[op], "%s", op)
	}
	before := extraops.Calls()
	run(t, func(xs []*graph.Node) *graph.Node {
		return graph.Reverse(graph.Pad(xs[0], graph.ScalarZero(xs[0].Graph(), dtypes.Float64), backends.PadAxis{Start: 1}), 0)
	}, tensors.FromValue([]float64{1, 2}))
	after := extraops.Calls()
	assert.Equal(t, before.Pads+1, after.Pads)
	assert.Equal(t, before.Reverses+1, after.Reverses)
	assert.True(t, extraops.Installed())
	assert.True(t, extraops.GradientsRegistered())
}

func f32(dims ...int) shapes.Shape { return shapes.Make(dtypes.Float32, dims...) }

// assertSame compares slices, nil and empty alike.
func assertSame[T any](t *testing.T, want, got []T, msgAndArgs ...any) {
	t.Helper()
	if len(want) == 0 {
		assert.Empty(t, got, msgAndArgs...)
		return
	}
	assert.Equal(t, want, got, msgAndArgs...)
}
