package blas

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gemmtile"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// Products through transposes. A DotGeneral lays its result out as [batch, lhs cross, rhs cross]; where an
// einsum wants the batch axes elsewhere (attention's heads, [batch, seq, heads, dim]) GoMLX follows it with a
// Transpose, and the gradients of such products read their operands through Transposes too. Each of those
// is a pass over the tensor that only moves data. When only batch axes move, each batch item's matrix keeps
// its rows and columns in order with unit column stride, which the gemm reads (operands) and writes (the
// result) in place through row strides and item offsets. The kernel computes each element from the same
// operands in the same order: the same bits as the DotGeneral followed by the Transpose.

// Operand is one operand of a planned Product: the DotGeneral's operand is the array of dimensions Dims
// read through Permutation (output axis i is Dims' axis Permutation[i], as a Transpose), or the array
// itself when Permutation is nil.
type Operand struct {
	Dims        []int
	Permutation []int
}

// Product is a DotGeneral planned to read its operands through their permutations and to write its result
// through one, without copies.
type Product struct {
	plan gemmPlan
	// swapped: the gemm computes the transposed products, rhs first (gemmShape.transposed).
	swapped bool
	// shape is the result's, in the layout its consumer reads.
	shape shapes.Shape
}

// throughCalls counts Products run.
var throughCalls atomic.Uint64

// PlanProduct plans dot, a DotGeneral node whose executor would be this package's, to read lhs and rhs
// through their permutations and to write its result [batch..., lhs cross..., rhs cross...] (the axes of
// the Reshape simplego puts after every DotGeneral) through output (nil: no permutation). ok is false when
// that needs a copy of any operand or of the result, or the node is not a float DotGeneral this package
// runs.
func PlanProduct(dot *simplego.Node, lhs, rhs Operand, output []int) (product *Product, ok bool) {
	params := dotGeneralParamsOf(dot)
	dotShape, shapeOK := gomlxpatch.NodeShape(dot)
	if params == nil || !shapeOK || (dotShape.DType != dtypes.Float32 && dotShape.DType != dtypes.Float64) {
		return nil, false
	}
	if !Built && (dotShape.DType == dtypes.Float64 || !gemmtile.Accelerated()) {
		// gonum's gemm sums in an order that depends on the transpose flags, which reading in place may
		// change: not the same bits. OpenBLAS and the tiles keep each element's order.
		return nil, false
	}
	lhsDims, lhsOK := operandDims(lhs)
	rhsDims, rhsOK := operandDims(rhs)
	if !lhsOK || !rhsOK || !sizesMatch(lhsDims, params.lhsBatchAxes, params.lhsContractingAxes, params.lhsCrossSize, params) ||
		!sizesMatch(rhsDims, params.rhsBatchAxes, params.rhsContractingAxes, params.rhsCrossSize, params) {
		return nil, false
	}
	lhsCross := rowsAxesOf(len(lhsDims), params.lhsBatchAxes, params.lhsContractingAxes)
	rhsCross := rowsAxesOf(len(rhsDims), params.rhsBatchAxes, params.rhsContractingAxes)

	// The operands as arrays read in place: every axis of the DotGeneral names the array's axis under it.
	// The cross axes must keep their order, which is the order of the result's rows and columns; and the
	// contracting axes theirs, which is the order of each element's sum (planGemm pairs them in memory
	// order).
	mapped := *params
	mapped.lhsBatchAxes, mapped.lhsContractingAxes = through(lhs.Permutation, params.lhsBatchAxes), through(lhs.Permutation, params.lhsContractingAxes)
	mapped.rhsBatchAxes, mapped.rhsContractingAxes = through(rhs.Permutation, params.rhsBatchAxes), through(rhs.Permutation, params.rhsContractingAxes)
	if !keepsOrder(lhs.Permutation, lhsCross) || !keepsOrder(rhs.Permutation, rhsCross) ||
		!keepsOrder(lhs.Permutation, params.lhsContractingAxes) || !keepsOrder(rhs.Permutation, params.rhsContractingAxes) ||
		!slices.Equal(sortedOrder(params.lhsContractingAxes), sortedOrder(params.rhsContractingAxes)) {
		// (When the two operands order their contracting axes differently, planGemm picks one order by
		// what each layout would copy, which may not be the order it picks for the Transposes' results.)
		return nil, false
	}
	plan, ok := planGemm(lhs.Dims, rhs.Dims, &mapped, false)
	if !ok {
		return nil, false
	}

	// The result: [batch, lhs cross, rhs cross] before output's permutation.
	resultDims := make([]int, 0, len(params.lhsBatchAxes)+len(lhsCross)+len(rhsCross))
	for _, axis := range params.lhsBatchAxes {
		resultDims = append(resultDims, lhsDims[axis])
	}
	for _, axis := range lhsCross {
		resultDims = append(resultDims, lhsDims[axis])
	}
	for _, axis := range rhsCross {
		resultDims = append(resultDims, rhsDims[axis])
	}
	product = &Product{plan: plan, shape: shapes.Make(dotShape.DType, resultDims...)}
	if output == nil {
		product.shape = dotShape // what the DotGeneral node itself holds: [batch, lhs cross, rhs cross] flat
		return product.sameKernel(lhsDims, rhsDims, params)
	}
	if len(output) != len(resultDims) || !isPermutation(output) {
		return nil, false
	}
	// position[r] is where the result's axis r lands in the consumer's layout.
	position := make([]int, len(output))
	outDims := make([]int, len(output))
	for j, r := range output {
		position[r] = j
		outDims[j] = resultDims[r]
	}
	numBatch, numRows := len(params.lhsBatchAxes), len(lhsCross)
	batchAxes, rowsAxes, columnsAxes := position[:numBatch], position[numBatch:numBatch+numRows], position[numBatch+numRows:]
	// stridedLayout takes the columns as its "contracting" axes: a layout with them last has unit column
	// stride. With the rows last instead, the gemm writes the transposed products.
	layout, ok := stridedLayout(outDims, batchAxes, rowsAxes, columnsAxes)
	if !ok {
		return nil, false
	}
	plan.gemm.ldC, plan.gemm.offC = layout.ld, layout.offsets
	if !layout.contractingLast {
		if plan.gemm.m == 1 || plan.gemm.n == 1 {
			// A product with one row or column may run as a matrix-vector product on one side of the swap
			// and not the other: keep the Transpose.
			return nil, false
		}
		plan.gemm = plan.gemm.transposed()
		product.swapped = true
	}
	product.plan = plan
	product.shape = shapes.Make(dotShape.DType, outDims...)
	return product.sameKernel(lhsDims, rhsDims, params)
}

// sameKernel returns the product, and true, when its gemm runs on the kernel the DotGeneral would run on
// with its operands copied out of the Transposes: the tiles and OpenBLAS round differently, and reading in
// place may change the transpose flags by which the kernel is chosen.
func (p *Product) sameKernel(lhsDims, rhsDims []int, params *dotGeneralParams) (*Product, bool) {
	copied, ok := planGemm(lhsDims, rhsDims, params, true)
	if !ok || (p.shape.DType == dtypes.Float32 && onTiles(copied.gemm) != onTiles(p.plan.gemm)) {
		return nil, false
	}
	return p, true
}

// Shape is the result's shape, in the layout its consumer reads.
func (p *Product) Shape() shapes.Shape { return p.shape }

// Run computes the product of the two arrays (inputs, in the layouts PlanProduct was given) into a new
// buffer of the backend.
func (p *Product) Run(backend *simplego.Backend, inputs []*simplego.Buffer) (*simplego.Buffer, error) {
	if len(inputs) != 2 {
		return nil, fmt.Errorf("blas: product: %d inputs, want 2", len(inputs))
	}
	lhsFlat, rhsFlat, ok := readOperands(inputs, backend.BufferData)
	if !ok {
		return nil, fmt.Errorf("blas: product: an operand cannot be read")
	}
	if p.swapped {
		lhsFlat, rhsFlat = rhsFlat, lhsFlat
	}
	output := backend.NewBuffer(p.shape)
	if output == nil {
		return nil, fmt.Errorf("blas: product: backend is finalized")
	}
	outputFlat, err := backend.BufferData(output)
	if err != nil {
		_ = backend.BufferFinalize(output)
		return nil, err
	}
	var ran bool
	switch outputFlat.(type) {
	case []float32:
		ran = runGemm(p.plan.gemm, lhsFlat, rhsFlat, outputFlat, sgemmBatched)
	case []float64:
		ran = runGemm(p.plan.gemm, lhsFlat, rhsFlat, outputFlat, dgemmBatched)
	}
	if !ran {
		_ = backend.BufferFinalize(output)
		return nil, fmt.Errorf("blas: product: operands of %T and %T for a result of %s", lhsFlat, rhsFlat, p.shape)
	}
	throughCalls.Add(1)
	return output, nil
}

// runGemm runs gemm on the flat data when all three hold T; it reports whether they did.
func runGemm[T float32 | float64](g gemmShape, lhs, rhs, out any, gemm func(gemmShape, []T, []T, []T)) bool {
	a, aOK := lhs.([]T)
	b, bOK := rhs.([]T)
	c, cOK := out.([]T)
	if aOK && bOK && cOK {
		gemm(g, a, b, c)
	}
	return aOK && bOK && cOK
}

// operandDims returns the dimensions of the DotGeneral's operand: o.Dims through o.Permutation.
func operandDims(o Operand) ([]int, bool) {
	if o.Permutation == nil {
		return o.Dims, true
	}
	if len(o.Permutation) != len(o.Dims) || !isPermutation(o.Permutation) {
		return nil, false
	}
	dims := make([]int, len(o.Dims))
	for i, axis := range o.Permutation {
		dims[i] = o.Dims[axis]
	}
	return dims, true
}

// through returns the array's axes under the operand's axes (all of them when permutation is nil).
func through(permutation, axes []int) []int {
	if permutation == nil {
		return axes
	}
	mapped := make([]int, len(axes))
	for i, axis := range axes {
		mapped[i] = permutation[axis]
	}
	return mapped
}

// keepsOrder reports whether the permutation keeps axes (of the operand) in the same relative order in the
// array beneath it.
func keepsOrder(permutation, axes []int) bool {
	return slices.IsSorted(through(permutation, slices.Sorted(slices.Values(axes))))
}

func isPermutation(axes []int) bool {
	seen := make([]bool, len(axes))
	for _, axis := range axes {
		if axis < 0 || axis >= len(axes) || seen[axis] {
			return false
		}
		seen[axis] = true
	}
	return true
}
