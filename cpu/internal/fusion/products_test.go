package fusion

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/blas"
	"github.com/goaccel/goaccel/cpu/internal/computetest"
	"github.com/goaccel/goaccel/cpu/internal/elementwise"
	"github.com/goaccel/goaccel/cpu/internal/gemmgrad"
)

// attention is multi-head attention's core as GoMLX's MultiHeadAttention builds it, with the gradients of
// a weighted sum of its output with respect to queries, keys and values: the forward pass's two einsums
// write [batch, seq, heads, …] through Transposes, and their gradients read through them.
func attention(x []*graph.Node) []*graph.Node {
	q, k, v, w := x[0], x[1], x[2], x[3]
	logits := graph.Einsum("bqhd,bkhd->bqhk", q, k)
	coefficients := graph.Softmax(logits, -1)
	out := graph.Einsum("bqhk,bkhd->bqhd", coefficients, v)
	loss := graph.ReduceAllSum(graph.Mul(out, w))
	return append([]*graph.Node{out}, graph.Gradient(loss, q, k, v)...)
}

// withMatrixKernel returns the fused backend with blas's DotGeneral executor installed for the test.
func withMatrixKernel(t *testing.T) backends.Backend {
	t.Helper()
	_, fused := backendsUnderTest(t)
	if !blas.Installed() {
		require.NoError(t, blas.Install(0))
		t.Cleanup(blas.Uninstall)
	}
	return fused
}

// TestProductsThroughTransposes runs attention and its gradients with and without the rewrite, on GoMLX's
// own product gradients and on gemmgrad's: the same bits, and the rewrite ran.
func TestProductsThroughTransposes(t *testing.T) {
	fused := withMatrixKernel(t)
	rng := rand.New(rand.NewPCG(21, 22))
	for _, gradients := range []string{"gomlx", "gemmgrad"} {
		for _, dims := range [][4]int{{2, 5, 3, 4}, {4, 64, 4, 32}} {
			t.Run(fmt.Sprintf("%s/%v", gradients, dims), func(t *testing.T) {
				if gradients == "gemmgrad" && !gemmgrad.Registered() {
					gemmgrad.Register()
					t.Cleanup(gemmgrad.Unregister)
				}
				b, s, h, d := dims[0], dims[1], dims[2], dims[3]
				args := []*tensors.Tensor{
					computetest.RandomTensor(rng, f32(b, s, h, d)), computetest.RandomTensor(rng, f32(b, s, h, d)),
					computetest.RandomTensor(rng, f32(b, s, h, d)), computetest.RandomTensor(rng, f32(b, s, h, d)),
				}
				productsOn = false
				want := runOn(t, fused, attention, args)
				productsOn = true
				before, transposesBefore := Calls(), elementwise.Calls().Transposes
				got := runOn(t, fused, attention, args)
				after, transposes := Calls(), elementwise.Calls().Transposes-transposesBefore
				for i := range want {
					sameValues(t, want[i], got[i], "%s output %d", gradients, i)
				}
				assert.GreaterOrEqual(t, after.Products-before.Products, uint64(2),
					"the forward einsums should write through their Transposes")
				assert.Equal(t, after.Products-before.Products, after.ProductRuns-before.ProductRuns,
					"each rewritten product runs once")
				if gradients == "gemmgrad" {
					// gemmgrad's gradients are one DotGeneral and at most one Transpose each: all absorbed,
					// including the incoming gradients' Transposes that two products read.
					assert.Zero(t, transposes, "a Transpose still ran")
				}
				t.Logf("%d products through transposes, %d Transposes ran", after.Products-before.Products, transposes)
			})
		}
	}
}

// TestTwoProductsReadOneTranspose: a Transpose read by two DotGenerals whose results need no Transpose
// (both rewritten in place) stops running once the first is rewritten as well as the second.
func TestTwoProductsReadOneTranspose(t *testing.T) {
	fused := withMatrixKernel(t)
	rng := rand.New(rand.NewPCG(25, 26))
	shape := f32(3, 8, 2, 4)
	args := []*tensors.Tensor{computetest.RandomTensor(rng, shape), computetest.RandomTensor(rng, shape),
		computetest.RandomTensor(rng, shape)}
	fn := func(x []*graph.Node) []*graph.Node {
		heads := graph.TransposeAllAxes(x[0], 0, 2, 1, 3) // [b, h, s, d]
		return []*graph.Node{
			graph.DotGeneral(heads, []int{3}, []int{0, 1}, x[1], []int{3}, []int{0, 2}),
			graph.DotGeneral(heads, []int{3}, []int{0, 1}, x[2], []int{3}, []int{0, 2}),
		}
	}
	productsOn = false
	want := runOn(t, fused, fn, args)
	productsOn = true
	before, transposesBefore := Calls(), elementwise.Calls().Transposes
	got := runOn(t, fused, fn, args)
	assert.Equal(t, uint64(2), Calls().Products-before.Products)
	assert.Zero(t, elementwise.Calls().Transposes-transposesBefore, "the Transpose still ran")
	for i := range want {
		sameValues(t, want[i], got[i], "output %d", i)
	}
}

// TestProductsNeedTheMatrixKernel: without blas's executor a DotGeneral stays simplego's, Transpose and all.
func TestProductsNeedTheMatrixKernel(t *testing.T) {
	_, fused := backendsUnderTest(t)
	if blas.Installed() {
		blas.Uninstall()
		t.Cleanup(func() { require.NoError(t, blas.Install(0)) })
	}
	rng := rand.New(rand.NewPCG(23, 24))
	shape := shapes.Make(f32(2, 5, 3, 4).DType, 2, 5, 3, 4)
	args := []*tensors.Tensor{computetest.RandomTensor(rng, shape), computetest.RandomTensor(rng, shape),
		computetest.RandomTensor(rng, shape), computetest.RandomTensor(rng, shape)}
	before := Calls()
	runOn(t, fused, attention, args)
	assert.Zero(t, Calls().Products-before.Products)
}
