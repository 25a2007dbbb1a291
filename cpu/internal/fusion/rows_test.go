package fusion

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/computetest"
	"github.com/goaccel/goaccel/cpu/internal/threads"
)

// gradientTolerance bounds how far the softmax gradient's row kernel, y·(g − Σ y·g), may land from GoMLX's
// operation-by-operation gradient: both are float32 evaluations of the same expression in another order,
// a few roundings of the row's largest term each. The bound is relative to that term (|y|·(|g| + Σ|y·g|)),
// as TestReductionsMatchSimplego bounds sums to 1e-5.
const gradientTolerance = 1e-5

// causalMask is attention's mask, as layers.MultiHeadAttention builds it: a lower triangle [T, T] over
// scores [b, T, h, T].
func causalMask(g *graph.Graph, dims []int) *graph.Node {
	t := dims[1]
	mask := graph.InsertAxes(graph.LowerTriangular(g, t), 0, 1)
	return graph.BroadcastToDims(mask, dims...)
}

// maskedSoftmaxWith is graph.MaskedSoftmax with another masking value for the maximum (GoMLX's is −∞;
// models that mask scores themselves use float32's lowest).
func maskedSoftmaxWith(logits, mask *graph.Node, lowest float64) *graph.Node {
	g := logits.Graph()
	masked := graph.Where(mask, logits, graph.BroadcastToDims(graph.Const(g, float32(lowest)), logits.Shape().Dimensions...))
	normalizingMax := graph.StopGradient(graph.ReduceAndKeep(masked, graph.ReduceMax, -1))
	zeros := graph.ZerosLike(logits)
	numerator := graph.Exp(graph.Where(mask, graph.Sub(logits, normalizingMax), zeros))
	numerator = graph.Where(mask, numerator, zeros)
	return graph.Where(mask, graph.Div(numerator, graph.ReduceAndKeep(numerator, graph.ReduceSum, -1)), zeros)
}

type rowCase struct {
	name string
	dims []int
	// fn returns the softmax (or layer norm) of x; mask is a random boolean tensor of x's shape.
	fn func(x, mask *graph.Node) *graph.Node
	// kernels is how many nodes must become row kernels: the forward, and the gradient when gradient.
	kernels  int
	gradient bool
}

func softmaxCases() []rowCase {
	causal := func(x, _ *graph.Node) *graph.Node {
		return graph.MaskedSoftmax(x, causalMask(x.Graph(), x.Shape().Dimensions), -1)
	}
	plain := func(x, _ *graph.Node) *graph.Node { return graph.Softmax(x, -1) }
	random := func(x, mask *graph.Node) *graph.Node { return graph.MaskedSoftmax(x, mask, -1) }
	lowest := func(x, _ *graph.Node) *graph.Node {
		return maskedSoftmaxWith(x, causalMask(x.Graph(), x.Shape().Dimensions), -math.MaxFloat32)
	}
	var cases []rowCase
	for _, grad := range []bool{false, true} {
		kernels := 1
		if grad {
			kernels = 2
		}
		suffix := map[bool]string{false: "", true: " and gradient"}[grad]
		// GoMLX builds another gradient for rows of one element, which is left as it is, and with it the
		// forward whose exponentials it reads.
		ofOne := kernels
		if grad {
			ofOne = 0
		}
		cases = append(cases,
			rowCase{"causal attention" + suffix, []int{4, 16, 3, 16}, causal, kernels, grad},
			rowCase{"causal attention, rows of 1" + suffix, []int{2, 1, 2, 1}, causal, ofOne, grad},
			rowCase{"causal attention, 70 long" + suffix, []int{1, 70, 2, 70}, causal, kernels, grad},
			rowCase{"causal, float32's lowest" + suffix, []int{2, 33, 2, 33}, lowest, kernels, grad},
			rowCase{"softmax" + suffix, []int{8, 37}, plain, kernels, grad},
			rowCase{"softmax, rows of 1" + suffix, []int{19, 1}, plain, ofOne, grad},
			rowCase{"softmax, long rows" + suffix, []int{3, 5003}, plain, kernels, grad},
			rowCase{"random mask" + suffix, []int{6, 5, 29}, random, kernels, grad},
			// Split over the compute threads: each part starts its walk of the mask rows mid-tensor.
			rowCase{"causal attention, large" + suffix, []int{8, 64, 4, 64}, causal, kernels, grad},
			rowCase{"random mask, large" + suffix, []int{6, 50, 3, 29}, random, kernels, grad},
		)
	}
	return cases
}

// specialRows puts NaN, ±Inf and ±0 in a few rows, and float32's lowest and largest values in others.
func specialRows(x *tensors.Tensor, n int) *tensors.Tensor {
	tensors.MustMutableFlatData[float32](x, func(flat []float32) {
		specials := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0,
			float32(math.Copysign(0, -1)), math.MaxFloat32, -math.MaxFloat32}
		for i, v := range specials {
			if j := (3*i+1)*n + i%n; j < len(flat) {
				flat[j] = v
			}
		}
	})
	return x
}

// randomMask has rows of every kind: all false, all true, a prefix, and random.
func randomMask(rng *rand.Rand, dims []int) *tensors.Tensor {
	n := dims[len(dims)-1]
	size := 1
	for _, d := range dims {
		size *= d
	}
	mask := make([]bool, size)
	for r := 0; r*n < size; r++ {
		row := mask[r*n : (r+1)*n]
		switch r % 4 {
		case 1:
			for i := range row {
				row[i] = true
			}
		case 2:
			for i := range row[:rng.IntN(n+1)] {
				row[i] = true
			}
		case 3:
			for i := range row {
				row[i] = rng.IntN(2) == 0
			}
		}
	}
	return tensors.FromFlatDataAndDimensions(mask, dims...)
}

// runRows runs tc on backend: the forward, and with tc.gradient the gradient of Σ softmax·w with respect to
// the logits too.
func runRows(t *testing.T, backend backends.Backend, tc rowCase, x, w, mask *tensors.Tensor) []*tensors.Tensor {
	t.Helper()
	exec := graph.MustNewExec(backend, func(x, w, mask *graph.Node) []*graph.Node {
		y := tc.fn(x, mask)
		if !tc.gradient {
			return []*graph.Node{y}
		}
		return []*graph.Node{y, graph.Gradient(graph.ReduceAllSum(graph.Mul(y, w)), x)[0]}
	})
	var args []any
	for _, v := range []*tensors.Tensor{x, w, mask} {
		local, err := v.LocalClone()
		require.NoError(t, err)
		args = append(args, local)
	}
	return exec.MustExec(args...)
}

// TestSoftmaxRowKernels runs softmaxes as GoMLX builds them with and without row kernels: the forward is
// bitwise the same (NaN, infinities, fully masked rows included), the gradient within gradientTolerance of
// each element's scale, and NaN exactly where GoMLX's is.
func TestSoftmaxRowKernels(t *testing.T) {
	unfused, fused := backendsUnderTest(t)
	defer threads.Set(threads.Budget())
	threads.Set(3) // the large cases split their rows over uneven parts
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range softmaxCases() {
		t.Run(tc.name, func(t *testing.T) {
			s := shapes.Make(dtypes.Float32, tc.dims...)
			n := tc.dims[len(tc.dims)-1]
			x := specialRows(computetest.RandomTensor(rng, s), n)
			tensors.MustMutableFlatData[float32](x, func(flat []float32) {
				for i := range flat {
					flat[i] *= 8 // scores spread as attention's are
				}
			})
			w, mask := computetest.RandomTensor(rng, s), randomMask(rng, tc.dims)
			want := runRows(t, unfused, tc, x, w, mask)
			before := Calls()
			got := runRows(t, fused, tc, x, w, mask)
			after := Calls()
			assert.Equal(t, uint64(tc.kernels), after.RowKernels-before.RowKernels, "row kernels compiled")
			sameValues(t, want[0], got[0], "softmax")
			if tc.gradient {
				y := tensors.MustCopyFlatData[float32](got[0])
				closeGradients(t, y, tensors.MustCopyFlatData[float32](w), tensors.MustCopyFlatData[float32](want[1]),
					tensors.MustCopyFlatData[float32](got[1]), n)
			}
		})
	}
}

// closeGradients compares softmax gradients row by row, relative to the row's scale |y|·(|g| + Σ|y·g|).
func closeGradients(t *testing.T, y, g, want, got []float32, n int) {
	t.Helper()
	for r := 0; r*n < len(y); r++ {
		var dot float64
		for i := r * n; i < (r+1)*n; i++ {
			dot += math.Abs(float64(y[i]) * float64(g[i]))
		}
		for i := r * n; i < (r+1)*n; i++ {
			w, v := float64(want[i]), float64(got[i])
			if w == v {
				continue
			}
			if math.IsNaN(w) || math.IsNaN(v) {
				require.Equal(t, math.IsNaN(w), math.IsNaN(v), "element %d: GoMLX %g, row kernel %g", i, w, v)
				continue
			}
			scale := math.Abs(float64(y[i])) * (math.Abs(float64(g[i])) + dot)
			require.False(t, math.IsNaN(scale) || math.IsInf(scale, 0),
				"element %d (row %d of non-finite values): GoMLX %g, row kernel %g", i, r, w, v)
			require.LessOrEqual(t, math.Abs(w-v), gradientTolerance*scale+1e-30,
				"element %d (row %d): GoMLX %g, row kernel %g", i, r, w, v)
		}
	}
}

// TestSoftmaxGradientFiniteDifferences checks the row kernel's gradient against central differences of the
// softmax in float64 (the kernel's forward is GoMLX's, so the differences test the gradient alone).
func TestSoftmaxGradientFiniteDifferences(t *testing.T) {
	_, fused := backendsUnderTest(t)
	rng := rand.New(rand.NewPCG(5, 6))
	dims := []int{2, 6, 2, 6}
	s := shapes.Make(dtypes.Float32, dims...)
	x, w := computetest.RandomTensor(rng, s), computetest.RandomTensor(rng, s)
	tc := rowCase{fn: func(x, _ *graph.Node) *graph.Node {
		return graph.MaskedSoftmax(x, causalMask(x.Graph(), dims), -1)
	}, gradient: true}
	got := tensors.MustCopyFlatData[float32](runRows(t, fused, tc, x, w, randomMask(rng, dims))[1])
	xs, ws := tensors.MustCopyFlatData[float32](x), tensors.MustCopyFlatData[float32](w)
	n := dims[3]
	// loss of row r: Σ_i softmax(x_r)_i·w_ri over the causal prefix of the row (query q sees keys 0…q).
	loss := func(row []float64, weights []float32, length int) float64 {
		m := math.Inf(-1)
		for _, v := range row[:length] {
			m = max(m, v)
		}
		var sum, dot float64
		for i, v := range row[:length] {
			e := math.Exp(v - m)
			sum += e
			dot += e * float64(weights[i])
		}
		return dot / sum
	}
	const h = 1e-4
	for r := 0; r*n < len(xs); r++ {
		q := (r / dims[2]) % dims[1]
		row := make([]float64, n)
		for i := range row {
			row[i] = float64(xs[r*n+i])
		}
		for i := range n {
			want := 0.0
			if i <= q {
				saved := row[i]
				row[i] = saved + h
				up := loss(row, ws[r*n:], q+1)
				row[i] = saved - h
				down := loss(row, ws[r*n:], q+1)
				row[i] = saved
				want = (up - down) / (2 * h)
			}
			assert.InDelta(t, want, got[r*n+i], 1e-5, "row %d, element %d", r, i)
		}
	}
}

// TestLayerNormRowKernel runs layers.LayerNormalization with and without the row kernel: bitwise the same.
// In a training graph the gradient reads the forward's intermediate results, and the forward stays as
// GoMLX builds it.
func TestLayerNormRowKernel(t *testing.T) {
	unfused, fused := backendsUnderTest(t)
	rng := rand.New(rand.NewPCG(7, 8))
	defer threads.Set(threads.Budget())
	threads.Set(3) // the large cases split their rows over uneven parts
	// What the graph differentiates: nothing, the input alone (the loss Σ y²), or the input, the gain and the
	// offset (the loss Σ y·w), as a transformer's training step does.
	const (
		forward = iota
		input
		all
		residual // every gradient, and the input read by a residual connection too
	)
	for _, tc := range []struct {
		name    string
		dims    []int
		epsilon float64
		wrt     int
		kernels int // the forward, the input's gradient, and dy times the normalised values
	}{
		{"transformer", []int{4, 16, 128}, 1e-5, forward, 1},
		{"rows of 1", []int{5, 1}, 1e-3, forward, 1},
		{"long rows", []int{3, 4099}, 1e-5, forward, 1},
		{"large: rows split over threads", []int{32, 64, 128}, 1e-5, forward, 1},
		{"with the input's gradient", []int{4, 8, 32}, 1e-5, input, 2},
		{"with every gradient", []int{4, 8, 32}, 1e-5, all, 3},
		// GoMLX builds another gradient for rows of one element, which is left as it is.
		{"every gradient, rows of 1", []int{6, 1}, 1e-3, all, 1},
		{"every gradient, long rows", []int{2, 3, 2053}, 1e-5, all, 3},
		{"every gradient, large: split over threads", []int{32, 64, 128}, 1e-5, all, 3},
		// One row: GoMLX builds the input's gradient otherwise (left to it, and the forward with it); the
		// forward's product with the gain, of the input's shape here, is not taken for the gain's product.
		{"every gradient, one row", []int{1, 1, 32}, 1e-5, all, 1},
		{"a residual connection", []int{4, 8, 32}, 1e-5, residual, 3},
		{"a residual connection, large", []int{32, 64, 128}, 1e-5, residual, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := shapes.Make(dtypes.Float32, tc.dims...)
			n := tc.dims[len(tc.dims)-1]
			x := specialRows(computetest.RandomTensor(rng, s), n)
			w := specialRows(computetest.RandomTensor(rng, s), n)
			gain := computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, n))
			run := func(backend backends.Backend) []*tensors.Tensor {
				ctx := context.New()
				exec := context.MustNewExec(backend, ctx, func(ctx *context.Context, x, w *graph.Node) []*graph.Node {
					switch tc.wrt {
					case input:
						y := layers.LayerNormalization(ctx, x, -1).Epsilon(tc.epsilon).Done()
						return []*graph.Node{y, graph.Gradient(graph.ReduceAllSum(graph.Mul(y, y)), x)[0]}
					case all:
						return layerNormTrainingWith(ctx, x, w, tc.epsilon)
					case residual:
						// x is an activation of the loss's input (as a block's input is), read by the layer
						// norm and by the residual sum.
						h := graph.Mul(x, x)
						y := graph.Add(h, layers.LayerNormalization(ctx, h, -1).Epsilon(tc.epsilon).Done())
						wrt := []*graph.Node{x}
						for v := range ctx.IterVariables() {
							wrt = append(wrt, v.ValueGraph(x.Graph()))
						}
						return append([]*graph.Node{y}, graph.Gradient(graph.ReduceAllSum(graph.Mul(y, w)), wrt...)...)
					}
					return []*graph.Node{layers.LayerNormalization(ctx, x, -1).Epsilon(tc.epsilon).Done()}
				})
				local := func(v *tensors.Tensor) *tensors.Tensor {
					c, err := v.LocalClone()
					require.NoError(t, err)
					return c
				}
				// A gain and an offset other than GoMLX's initial ones and zeros.
				exec.MustExec(local(x), local(w))
				for v := range ctx.IterVariables() {
					if v.Shape().Size() == n {
						v.MustSetValue(local(gain))
					}
				}
				return exec.MustExec(local(x), local(w))
			}
			want := run(unfused)
			before := Calls()
			got := run(fused)
			after := Calls()
			assert.Equal(t, uint64(tc.kernels), after.RowKernels-before.RowKernels, "row kernels compiled")
			for i := range want {
				sameValues(t, want[i], got[i], "output %d", i)
			}
		})
	}
}

// TestLayerNormGradientFiniteDifferences checks the rewritten gradient with respect to the input against
// float64 central differences of the layer norm, on rows without special values.
func TestLayerNormGradientFiniteDifferences(t *testing.T) {
	_, fused := backendsUnderTest(t)
	rng := rand.New(rand.NewPCG(17, 18))
	const n, rows, epsilon = 12, 3, 1e-5
	xs := make([]float32, rows*n)
	ws := make([]float32, rows*n)
	gain := make([]float32, n)
	for i := range xs {
		xs[i], ws[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	for i := range gain {
		gain[i] = float32(0.5 + rng.Float64())
	}
	ctx := context.New()
	exec := context.MustNewExec(fused, ctx, func(ctx *context.Context, x, w *graph.Node) []*graph.Node {
		return layerNormTrainingWith(ctx, x, w, epsilon)
	})
	x := tensors.FromFlatDataAndDimensions(xs, rows, n)
	w := tensors.FromFlatDataAndDimensions(ws, rows, n)
	exec.MustExec(x, w)
	for v := range ctx.IterVariables() {
		if v.Shape().Size() == n && v.Name() == "gain" {
			v.MustSetValue(tensors.FromFlatDataAndDimensions(slices.Clone(gain), n))
		}
	}
	before := Calls()
	out := exec.MustExec(x, w)
	require.Equal(t, before.RowKernels, Calls().RowKernels, "compiled before")
	dx := tensors.MustCopyFlatData[float32](out[1])
	// loss(x) = Σ LN(x)·w in float64.
	loss := func(x []float64) float64 {
		total := 0.0
		for r := range rows {
			row := x[r*n : (r+1)*n]
			mean, variance := 0.0, 0.0
			for _, v := range row {
				mean += v
			}
			mean /= n
			for _, v := range row {
				variance += (v - mean) * (v - mean)
			}
			deviation := math.Sqrt(variance/n + epsilon)
			for i, v := range row {
				total += (v - mean) / deviation * float64(gain[i]) * float64(ws[r*n+i])
			}
		}
		return total
	}
	x64 := make([]float64, len(xs))
	for i, v := range xs {
		x64[i] = float64(v)
	}
	const h = 1e-6
	for i := range x64 {
		saved := x64[i]
		x64[i] = saved + h
		up := loss(x64)
		x64[i] = saved - h
		down := loss(x64)
		x64[i] = saved
		assert.InDelta(t, (up-down)/(2*h), float64(dx[i]), 1e-3, "element %d", i)
	}
}

// TestRowKernelsLeaveOtherGraphsAlone: reductions and chains that only resemble a softmax stay as they are.
func TestRowKernelsLeaveOtherGraphsAlone(t *testing.T) {
	unfused, fused := backendsUnderTest(t)
	rng := rand.New(rand.NewPCG(9, 10))
	for name, fn := range map[string]func(x *graph.Node) *graph.Node{
		"softmax over the first axis": func(x *graph.Node) *graph.Node { return graph.Softmax(x, 0) },
		"exp over a sum of exp, no max": func(x *graph.Node) *graph.Node {
			e := graph.Exp(x)
			return graph.Div(e, graph.ReduceAndKeep(e, graph.ReduceSum, -1))
		},
		"log softmax": func(x *graph.Node) *graph.Node { return graph.LogSoftmax(x, -1) },
	} {
		t.Run(name, func(t *testing.T) {
			x := computetest.RandomTensor(rng, shapes.Make(dtypes.Float32, 9, 31))
			run := func(backend backends.Backend) *tensors.Tensor {
				local, err := x.LocalClone()
				require.NoError(t, err)
				return graph.MustNewExec(backend, fn).MustExec(local)[0]
			}
			want := run(unfused)
			before := Calls()
			got := run(fused)
			assert.Equal(t, before.RowKernels, Calls().RowKernels, "row kernels compiled")
			sameValues(t, want, got, "result")
		})
	}
}

// BenchmarkRowKernels times the transformer example's softmaxes (causal attention scores [32, 64, 4, 64])
// and layer norms ([32, 64, 128]) as element-wise chains around the reductions ("chains") and as row
// kernels ("rows"), forward alone and forward with the gradient.
func BenchmarkRowKernels(b *testing.B) {
	_, fused := backendsUnderTest(b)
	rng := rand.New(rand.NewPCG(11, 12))
	scores := []int{32, 64, 4, 64}
	for _, bc := range []struct {
		name string
		dims []int
		fn   func(x, w *graph.Node) []*graph.Node
	}{
		{"softmax", scores, func(x, _ *graph.Node) []*graph.Node {
			return []*graph.Node{graph.MaskedSoftmax(x, causalMask(x.Graph(), scores), -1)}
		}},
		{"softmax+gradient", scores, func(x, w *graph.Node) []*graph.Node {
			y := graph.MaskedSoftmax(x, causalMask(x.Graph(), scores), -1)
			return []*graph.Node{y, graph.Gradient(graph.ReduceAllSum(graph.Mul(y, w)), x)[0]}
		}},
		{"layernorm", []int{32, 64, 128}, func(x, w *graph.Node) []*graph.Node {
			mean := graph.ReduceAndKeep(x, graph.ReduceMean, -1)
			c := graph.Sub(x, mean)
			variance := graph.ReduceAndKeep(graph.Square(c), graph.ReduceMean, -1)
			n := graph.Div(c, graph.Sqrt(graph.Add(variance, graph.ConstAs(x, 1e-5))))
			gain := graph.Reshape(graph.Slice(w, graph.AxisRange(0, 1), graph.AxisRange(0, 1)), 1, 1, 128)
			offset := graph.Reshape(graph.Slice(w, graph.AxisRange(1, 2), graph.AxisRange(0, 1)), 1, 1, 128)
			return []*graph.Node{graph.Add(graph.Mul(n, gain), offset)}
		}},
	} {
		for _, on := range []bool{false, true} {
			name := map[bool]string{false: "chains", true: "rows"}[on]
			b.Run(bc.name+"/"+name, func(b *testing.B) {
				defer func(was bool) { rowKernelsOn = was }(rowKernelsOn)
				rowKernelsOn = on
				s := shapes.Make(dtypes.Float32, bc.dims...)
				x, w := computetest.RandomTensor(rng, s), computetest.RandomTensor(rng, s)
				exec := graph.MustNewExec(fused, bc.fn)
				exec.MustExec(x, w)
				b.SetBytes(int64(4 * s.Size()))
				b.ResetTimer()
				for range b.N {
					for _, out := range exec.MustExec(x, w) {
						out.FinalizeAll()
					}
				}
			})
		}
	}
}

// BenchmarkLayerNormTraining is a transformer's layer norm in training ([32, 64, 128], GoMLX's layer with its
// gain and offset): the forward and the gradients with respect to the input, the gain and the offset.
func BenchmarkLayerNormTraining(b *testing.B) {
	_, fused := backendsUnderTest(b)
	rng := rand.New(rand.NewPCG(15, 16))
	s := shapes.Make(dtypes.Float32, 32, 64, 128)
	x, w := computetest.RandomTensor(rng, s), computetest.RandomTensor(rng, s)
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "chains", true: "rows"}[on]
		b.Run(name, func(b *testing.B) {
			defer func(was bool) { rowKernelsOn = was }(rowKernelsOn)
			rowKernelsOn = on
			exec := context.MustNewExec(fused, context.New(), layerNormTraining)
			exec.MustExec(x, w)
			b.SetBytes(int64(4 * s.Size()))
			b.ResetTimer()
			for range b.N {
				for _, out := range exec.MustExec(x, w) {
					out.FinalizeAll()
				}
			}
		})
	}
}

// layerNormTraining is GoMLX's layer norm of x and its gradients (input, gain, offset) for the loss Σ y·w.
func layerNormTraining(ctx *context.Context, x, w *graph.Node) []*graph.Node {
	return layerNormTrainingWith(ctx, x, w, 1e-5)
}

func layerNormTrainingWith(ctx *context.Context, x, w *graph.Node, epsilon float64) []*graph.Node {
	y := layers.LayerNormalization(ctx, x, -1).Epsilon(epsilon).Done()
	wrt := []*graph.Node{x}
	for v := range ctx.IterVariables() {
		wrt = append(wrt, v.ValueGraph(x.Graph()))
	}
	return append([]*graph.Node{y}, graph.Gradient(graph.ReduceAllSum(graph.Mul(y, w)), wrt...)...)
}
