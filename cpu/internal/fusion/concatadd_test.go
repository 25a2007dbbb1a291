package fusion

import (
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
	"github.com/goaccel/goaccel/cpu/internal/threads"
)

// flatConcat is bucketgraph.Flatten's shape of a bucket: every part reshaped to a vector, concatenated.
func flatConcat(parts []*graph.Node) *graph.Node {
	flat := make([]*graph.Node, len(parts))
	for i, p := range parts {
		flat[i] = graph.Reshape(p, -1)
	}
	return graph.Concatenate(flat, 0)
}

// runOn runs fn on backend with local copies of args (an execution may take its inputs' buffers).
func runOn(t *testing.T, backend backends.Backend, fn func([]*graph.Node) []*graph.Node, args []*tensors.Tensor) []*tensors.Tensor {
	t.Helper()
	local := make([]any, len(args))
	for i, a := range args {
		c, err := a.LocalClone()
		require.NoError(t, err)
		local[i] = c
	}
	return graph.MustNewExec(backend, fn).MustExec(local...)
}

// TestConcatAddKernel runs accumulator + concatenation graphs with and without the rewrite: the sums are
// bitwise the same (NaN, infinities and signed zeros included), in either operand order, split over threads
// or not, and look-alikes are left as they are.
func TestConcatAddKernel(t *testing.T) {
	unfused, fused := backendsUnderTest(t)
	rng := rand.New(rand.NewPCG(11, 12))
	defer threads.Set(threads.Budget())
	threads.Set(3) // uneven ranges, whatever the machine's cores
	for _, tc := range []struct {
		name      string
		parts     [][]int
		dtype     dtypes.DType
		fn        func(acc *graph.Node, parts []*graph.Node) []*graph.Node
		rewritten int
	}{
		{"a bucket of three gradients", [][]int{{3, 4}, {5}, {2, 2, 2}}, dtypes.Float32,
			func(acc *graph.Node, parts []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(acc, flatConcat(parts))}
			}, 1},
		{"the concatenation first", [][]int{{7}, {1}, {3, 3}}, dtypes.Float32,
			func(acc *graph.Node, parts []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(flatConcat(parts), acc)}
			}, 1},
		{"large: split over threads", [][]int{{128, 784}, {128}, {10, 128}, {10}, {9, 1001}}, dtypes.Float32,
			func(acc *graph.Node, parts []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(acc, flatConcat(parts))}
			}, 1},
		{"parts that are not reshapes", [][]int{{40}, {24}}, dtypes.Float32,
			func(acc *graph.Node, parts []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(acc, graph.Concatenate([]*graph.Node{graph.Neg(parts[0]), parts[1]}, 0))}
			}, 1},
		{"a scalar accumulator: zeros known, not read", [][]int{{3, 40}, {17}, {2, 5}}, dtypes.Float32,
			func(_ *graph.Node, parts []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(flatConcat(parts), graph.Scalar(parts[0].Graph(), dtypes.Float32, 0))}
			}, 1},
		{"a scalar, large: split over threads", [][]int{{128, 784}, {10, 128}, {9, 1001}}, dtypes.Float32,
			func(_ *graph.Node, parts []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(graph.Scalar(parts[0].Graph(), dtypes.Float32, 1.5), flatConcat(parts))}
			}, 1},
		{"the concatenation read again: left alone", [][]int{{4}, {6}}, dtypes.Float32,
			func(acc *graph.Node, parts []*graph.Node) []*graph.Node {
				c := flatConcat(parts)
				return []*graph.Node{graph.Add(acc, c), graph.Mul(c, c)}
			}, 0},
		{"along another axis: left alone", [][]int{{3, 2}, {3, 5}}, dtypes.Float32,
			func(acc *graph.Node, parts []*graph.Node) []*graph.Node {
				sum := graph.Add(graph.Reshape(acc, 3, 7), graph.Concatenate(parts, 1))
				return []*graph.Node{sum}
			}, 0},
		{"float64: left alone", [][]int{{4}, {6}}, dtypes.Float64,
			func(acc *graph.Node, parts []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(acc, flatConcat(parts))}
			}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size := 0
			args := make([]*tensors.Tensor, len(tc.parts)+1)
			for i, dims := range tc.parts {
				x := computetest.RandomTensor(rng, shapes.Make(tc.dtype, dims...))
				if tc.dtype == dtypes.Float32 {
					x = specialRows(x, dims[len(dims)-1])
				}
				args[1+i] = x
				size += x.Shape().Size()
			}
			args[0] = computetest.RandomTensor(rng, shapes.Make(tc.dtype, size))
			run := func(backend backends.Backend) []*tensors.Tensor {
				return runOn(t, backend, func(in []*graph.Node) []*graph.Node { return tc.fn(in[0], in[1:]) }, args)
			}
			want := run(unfused)
			before := Calls()
			got := run(fused)
			after := Calls()
			assert.Equal(t, uint64(tc.rewritten), after.ConcatAdds-before.ConcatAdds, "concatenate-and-add nodes compiled")
			assert.Equal(t, uint64(tc.rewritten), after.ConcatAddRuns-before.ConcatAddRuns, "their runs")
			for i := range want {
				if tc.dtype == dtypes.Float32 {
					sameValues(t, want[i], got[i], "output %d", i)
				} else {
					assert.Equal(t, tensors.MustCopyFlatData[float64](want[i]), tensors.MustCopyFlatData[float64](got[i]))
				}
			}
		})
	}
}

// TestWindowsIntoBuckets runs updates that slice gradients out of a flat bucket (bucketgraph.Unflatten's
// shape) with and without fusion: the results are bitwise the same, and the contiguous slices are read
// inside the bucket; strided slices and slices of matrices are left to the Slice.
func TestWindowsIntoBuckets(t *testing.T) {
	unfused, fused := backendsUnderTest(t)
	rng := rand.New(rand.NewPCG(13, 14))
	for _, tc := range []struct {
		name    string
		fn      func(bucket, a, b *graph.Node) []*graph.Node
		windows int
	}{
		{"two parameters' updates", func(bucket, a, b *graph.Node) []*graph.Node {
			ga := graph.Reshape(graph.Slice(bucket, graph.AxisRange(0, 128)), 8, 16)
			gb := graph.Slice(bucket, graph.AxisRange(128, 168))
			return []*graph.Node{graph.Sub(a, graph.MulScalar(ga, 0.1)), graph.Sub(b, graph.MulScalar(gb, 0.1))}
		}, 2},
		{"the gradient read twice in one program", func(bucket, a, b *graph.Node) []*graph.Node {
			ga := graph.Reshape(graph.Slice(bucket, graph.AxisRange(37, 165)), 8, 16)
			return []*graph.Node{graph.Add(a, graph.Mul(ga, graph.Exp(ga))), b}
		}, 1},
		{"strided: left to the Slice", func(bucket, a, b *graph.Node) []*graph.Node {
			gb := graph.Slice(bucket, graph.AxisRange(0, 80).Stride(2))
			return []*graph.Node{a, graph.Sub(b, graph.MulScalar(gb, 0.1))}
		}, 0},
		{"a slice of a matrix: left to the Slice", func(bucket, a, b *graph.Node) []*graph.Node {
			m := graph.Reshape(graph.Slice(bucket, graph.AxisRange(0, 160)), 10, 16)
			ga := graph.Slice(m, graph.AxisRange(1, 9))
			return []*graph.Node{graph.Sub(a, graph.MulScalar(ga, 0.1)), b}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []*tensors.Tensor{
				specialRows(computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, 200)), 16),
				computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, 8, 16)),
				computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, 40)),
			}
			run := func(backend backends.Backend) []*tensors.Tensor {
				return runOn(t, backend, func(in []*graph.Node) []*graph.Node { return tc.fn(in[0], in[1], in[2]) }, args)
			}
			want := run(unfused)
			before := Calls()
			got := run(fused)
			after := Calls()
			assert.Equal(t, uint64(tc.windows), after.Windows-before.Windows, "inputs read inside the bucket")
			for i := range want {
				sameValues(t, want[i], got[i], "output %d", i)
			}
		})
	}
}
