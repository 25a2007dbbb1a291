package blas

import (
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/gemmtile"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// throughCase is a DotGeneral whose operands are Transposes of stored arrays (a nil permutation: the array
// itself) and whose result is read through a Transpose (nil: as it is).
type throughCase struct {
	dotGeneralCase
	lhsPermutation, rhsPermutation, outPermutation []int
}

// storedDims returns the dimensions of the array an operand of operandDims is a Transpose of.
func storedDims(operandDims, permutation []int) []int {
	if permutation == nil {
		return operandDims
	}
	dims := make([]int, len(operandDims))
	for i, axis := range permutation {
		dims[axis] = operandDims[i]
	}
	return dims
}

// maybePermutation returns nil half the time, else a random permutation of rank axes.
func maybePermutation(rng *rand.Rand, rank int) []int {
	if rng.IntN(2) == 0 {
		return nil
	}
	return rng.Perm(rank)
}

// TestProductsThroughTransposesMatchTheGraph runs random DotGenerals through transposed operands and results
// as planned Products and compares them with GoMLX's graph (Transposes, then this package's DotGeneral,
// then a Transpose): the same bits, since each element is the same sum in the same order on OpenBLAS and
// on the tiles. It checks that operand, result and
// transposed-result plans all ran, and that plans refused are refused for a reason (a copy needed).
func TestProductsThroughTransposesMatchTheGraph(t *testing.T) {
	float32Kernels(t, testProductsThroughTransposes)
}

func testProductsThroughTransposes(t *testing.T) {
	backend := newBackend(t)
	rng := rand.New(rand.NewPCG(11, 12))
	var planned, throughOperand, throughResult, swapped int
	before := Calls()
	for i := range 400 {
		c := throughCase{dotGeneralCase: randomStridedCase(rng)}
		c.lhsPermutation = maybePermutation(rng, len(c.lhsDims))
		c.rhsPermutation = maybePermutation(rng, len(c.rhsDims))
		resultRank := len(c.lhsDims) - len(c.lhsContracting) + len(c.rhsDims) - len(c.rhsContracting) - len(c.rhsBatch)
		c.outPermutation = maybePermutation(rng, resultRank)
		dtype := dtypes.Float32
		if i%3 == 2 {
			dtype = dtypes.Float64
		}
		product, got := runThroughCase(t, backend.(*simplego.Backend), rng, dtype, c)
		if product == nil {
			continue
		}
		planned++
		if c.lhsPermutation != nil || c.rhsPermutation != nil {
			throughOperand++
		}
		if c.outPermutation != nil {
			throughResult++
		}
		if product.swapped {
			swapped++
		}
		want := graphThroughCase(t, backend, c, got.lhs, got.rhs)
		require.Equal(t, want.Shape(), got.result.Shape(), "%+v", c)
		require.Equal(t, want.Value(), got.result.Value(), "%s %+v", dtype, c)
	}
	t.Logf("planned %d of 400: %d through an operand, %d through the result (%d transposed)", planned,
		throughOperand, throughResult, swapped)
	assert.Positive(t, throughOperand, "no plan read an operand through a Transpose")
	assert.Positive(t, throughResult, "no plan wrote its result through a Transpose")
	assert.Positive(t, swapped, "no plan wrote the transposed products")
	assert.Equal(t, uint64(planned), Calls().Through-before.Through, "Calls().Through counts every run")
}

type throughResult struct {
	lhs, rhs, result *tensors.Tensor
}

// runThroughCase plans c's DotGeneral (planThroughCase) and, when planned, runs it on random stored arrays.
func runThroughCase(t *testing.T, backend *simplego.Backend, rng *rand.Rand, dtype dtypes.DType,
	c throughCase) (*Product, throughResult) {
	t.Helper()
	product, ok := planThroughCase(t, backend, dtype, c)
	if !ok {
		return nil, throughResult{}
	}
	lhsStored, rhsStored := storedDims(c.lhsDims, c.lhsPermutation), storedDims(c.rhsDims, c.rhsPermutation)
	lhs, rhs := randomTensor(rng, dtype, lhsStored), randomTensor(rng, dtype, rhsStored)
	buffers := make([]*simplego.Buffer, 2)
	for i, x := range []*tensors.Tensor{lhs, rhs} {
		var flat any
		switch dtype {
		case dtypes.Float32:
			flat = tensors.MustCopyFlatData[float32](x)
		case dtypes.Float64:
			flat = tensors.MustCopyFlatData[float64](x)
		}
		buffer, err := backend.BufferFromFlatData(0, flat, x.Shape())
		require.NoError(t, err)
		buffers[i] = buffer.(*simplego.Buffer)
	}
	output, err := product.Run(backend, buffers)
	require.NoError(t, err)
	flat, err := backend.BufferData(output)
	require.NoError(t, err)
	dims := product.Shape().Dimensions
	if c.outPermutation == nil {
		dims = resultDims(c) // the DotGeneral node's own layout is before simplego's Reshape
	}
	var result *tensors.Tensor
	switch flat := flat.(type) {
	case []float32:
		result = tensors.FromFlatDataAndDimensions(flat, dims...)
	case []float64:
		result = tensors.FromFlatDataAndDimensions(flat, dims...)
	}
	return product, throughResult{lhs: lhs, rhs: rhs, result: result}
}

// resultDims returns the dimensions of c's DotGeneral result: batch, lhs cross, rhs cross.
func resultDims(c throughCase) []int {
	var dims []int
	for _, axis := range c.lhsBatch {
		dims = append(dims, c.lhsDims[axis])
	}
	dims = append(dims, crossDims(c.lhsDims, c.lhsBatch, c.lhsContracting)...)
	return append(dims, crossDims(c.rhsDims, c.rhsBatch, c.rhsContracting)...)
}

func crossDims(dims, batch, contracting []int) []int {
	var cross []int
	for _, axis := range rowsAxesOf(len(dims), batch, contracting) {
		cross = append(cross, dims[axis])
	}
	return cross
}

// graphThroughCase computes c with GoMLX's graph and this package's DotGeneral executor.
func graphThroughCase(t *testing.T, backend backends.Backend, c throughCase, lhs, rhs *tensors.Tensor) *tensors.Tensor {
	t.Helper()
	exec := graph.MustNewExec(backend, func(lhs, rhs *graph.Node) *graph.Node {
		if c.lhsPermutation != nil {
			lhs = graph.TransposeAllAxes(lhs, c.lhsPermutation...)
		}
		if c.rhsPermutation != nil {
			rhs = graph.TransposeAllAxes(rhs, c.rhsPermutation...)
		}
		result := graph.DotGeneral(lhs, c.lhsContracting, c.lhsBatch, rhs, c.rhsContracting, c.rhsBatch)
		if c.outPermutation != nil {
			result = graph.TransposeAllAxes(result, c.outPermutation...)
		}
		return result
	})
	defer exec.Finalize()
	require.NoError(t, Install(0))
	defer Uninstall()
	return exec.MustExec1(lhs, rhs)
}

// TestPlanAttentionThroughTransposes checks attention's two products as GoMLX writes them: the scores
// DotGeneral [b,h,q,k] laid out [b,q,h,k], and the weighted values [b,h,q,d] laid out [b,q,h,d], both
// written in place with rows heads·cols apart.
func TestPlanAttentionThroughTransposes(t *testing.T) {
	backend := newBackend(t).(*simplego.Backend)
	builder := backend.Builder("attention")
	const b, q, h, d = 2, 5, 3, 4
	query, err := builder.Parameter("q", shapes.Make(dtypes.Float32, b, q, h, d), nil)
	require.NoError(t, err)
	scores, err := builder.DotGeneral(query, []int{3}, []int{0, 2}, query, []int{3}, []int{0, 2})
	require.NoError(t, err)
	dot := gomlxpatch.NodeInputs(scores.(*simplego.Node))[0]
	stored := Operand{Dims: []int{b, q, h, d}}
	product, ok := PlanProduct(dot, stored, stored, []int{0, 2, 1, 3})
	require.True(t, ok)
	assert.Equal(t, []int{b, q, h, q}, product.Shape().Dimensions)
	assert.False(t, product.swapped)
	assert.Equal(t, h*q, product.plan.gemm.ldC, "rows of [b,q,h,k] lie heads·keys apart")
	assert.Equal(t, int64(q), product.plan.gemm.offC[1], "head 1 starts one row of keys in")

	// Batch axes may go anywhere but last.
	_, ok = PlanProduct(dot, stored, stored, []int{2, 0, 1, 3})
	assert.True(t, ok, "batch axes anywhere: still in place")
	product, ok = PlanProduct(dot, stored, stored, []int{0, 3, 1, 2})
	require.True(t, ok, "[b,k,h,q], queries last: the transposed products")
	assert.True(t, product.swapped)
	_, ok = PlanProduct(dot, stored, stored, []int{0, 2, 3, 1})
	assert.False(t, ok, "a batch axis last: no unit column stride without a copy")
	_, ok = PlanProduct(dot, stored, stored, []int{2, 3, 0, 1})
	assert.False(t, ok, "batch axes last: no unit column stride without a copy")
}

// planThroughCase builds c's DotGeneral with simplego's builder, its operands Transposes of stored arrays
// where c says so, and plans it.
func planThroughCase(t *testing.T, backend *simplego.Backend, dtype dtypes.DType, c throughCase) (*Product, bool) {
	t.Helper()
	builder := backend.Builder("through")
	lhsStored, rhsStored := storedDims(c.lhsDims, c.lhsPermutation), storedDims(c.rhsDims, c.rhsPermutation)
	operand := func(name string, dims, permutation []int) backends.Op {
		op, err := builder.Parameter(name, shapes.Make(dtype, dims...), nil)
		require.NoError(t, err)
		if permutation != nil {
			op, err = builder.Transpose(op, permutation...)
			require.NoError(t, err)
		}
		return op
	}
	lhsOp, rhsOp := operand("lhs", lhsStored, c.lhsPermutation), operand("rhs", rhsStored, c.rhsPermutation)
	reshaped, err := builder.DotGeneral(lhsOp, c.lhsContracting, c.lhsBatch, rhsOp, c.rhsContracting, c.rhsBatch)
	require.NoError(t, err)
	dot := reshaped.(*simplego.Node)
	if op, _ := gomlxpatch.NodeOpType(dot); op == backends.OpTypeReshape {
		dot = gomlxpatch.NodeInputs(dot)[0]
	}
	return PlanProduct(dot, Operand{Dims: lhsStored, Permutation: c.lhsPermutation},
		Operand{Dims: rhsStored, Permutation: c.rhsPermutation}, c.outPermutation)
}

// TestPlanKeepsTheSumsOrder: an operand read through a permutation that reorders its contracting axes would
// sum each element in another order (the gemm pairs contracting axes in memory order), and one with a row
// or column of one element swapped might run as another kernel: both keep their Transposes.
func TestPlanKeepsTheSumsOrder(t *testing.T) {
	backend := newBackend(t).(*simplego.Backend)
	for _, tc := range []struct {
		name    string
		c       throughCase
		planned bool
	}{
		{"contracting axes reordered in both arrays", throughCase{
			dotGeneralCase: dotGeneralCase{lhsDims: []int{4, 3, 5}, rhsDims: []int{3, 5, 6},
				lhsContracting: []int{1, 2}, rhsContracting: []int{0, 1}},
			lhsPermutation: []int{0, 2, 1}, rhsPermutation: []int{1, 0, 2}}, false},
		{"contracting axes kept in order", throughCase{
			dotGeneralCase: dotGeneralCase{lhsDims: []int{4, 3, 5}, rhsDims: []int{3, 5, 6},
				lhsContracting: []int{1, 2}, rhsContracting: []int{0, 1}},
			rhsPermutation: []int{0, 1, 2}}, true},
		{"one row, transposed products", throughCase{
			dotGeneralCase: dotGeneralCase{lhsDims: []int{2, 1, 3}, rhsDims: []int{2, 4, 3},
				lhsBatch: []int{0}, rhsBatch: []int{0}, lhsContracting: []int{2}, rhsContracting: []int{2}},
			outPermutation: []int{0, 2, 1}}, false},
		{"several rows, transposed products", throughCase{
			dotGeneralCase: dotGeneralCase{lhsDims: []int{2, 5, 3}, rhsDims: []int{2, 4, 3},
				lhsBatch: []int{0}, rhsBatch: []int{0}, lhsContracting: []int{2}, rhsContracting: []int{2}},
			outPermutation: []int{0, 2, 1}}, true},
		// Copied out of its Transpose, A [64, 32] is plain and the product runs on the tiles beside OpenBLAS;
		// read in place it is transposed, which OpenBLAS would run: another rounding, so it is copied.
		{"another kernel in place", throughCase{
			dotGeneralCase: dotGeneralCase{lhsDims: []int{64, 32}, rhsDims: []int{32, 16},
				lhsContracting: []int{1}, rhsContracting: []int{0}},
			lhsPermutation: []int{1, 0}}, !tilesBesideOpenBLAS()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ok := planThroughCase(t, backend, dtypes.Float32, tc.c)
			if !Built && !gemmtile.Accelerated() {
				assert.False(t, ok, "gonum runs float32 here: nothing is planned")
				return
			}
			assert.Equal(t, tc.planned, ok)
		})
	}
}
