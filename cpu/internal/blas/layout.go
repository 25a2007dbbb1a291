package blas

import (
	"cmp"
	"slices"
)

// gemmShape describes a batch of independent row-major products C[i] = op(A[i]) · op(B[i]), with C[i] of
// shape [m, n] and the contraction of size k. A[i] is stored as [m, k], or as [k, m] when transA; B[i] as
// [k, n], or as [n, k] when transB. The batch items of each of A, B and C lie back to back, unless that
// array is strided: then its rows lie ldA (ldB, ldC) elements apart and item i starts at offA[i] (offB[i],
// offC[i]), as when the batch axes of an array lie between its rows and its columns (attention's heads).
type gemmShape struct {
	batch, m, n, k int
	transA, transB bool
	// ldA, ldB and ldC are the row strides; 0 means packed (the row length).
	ldA, ldB, ldC int
	// offA, offB and offC are the batch item starts; nil means back to back.
	offA, offB, offC []int64
}

// lda, ldb and ldc are the row strides of A, B and C, as cblas wants them for row-major storage.
func (g gemmShape) lda() int { return cmp.Or(g.ldA, pick(g.transA, g.m, g.k)) }
func (g gemmShape) ldb() int { return cmp.Or(g.ldB, pick(g.transB, g.k, g.n)) }
func (g gemmShape) ldc() int { return cmp.Or(g.ldC, g.n) }

// startA, startB and startC are where batch item i of A, B and C starts.
func (g gemmShape) startA(i int) int { return itemStart(g.offA, i, g.m*g.k) }
func (g gemmShape) startB(i int) int { return itemStart(g.offB, i, g.k*g.n) }
func (g gemmShape) startC(i int) int { return itemStart(g.offC, i, g.m*g.n) }

func itemStart(offsets []int64, i, packedSize int) int {
	if offsets != nil {
		return int(offsets[i])
	}
	return i * packedSize
}

// packed reports whether both operands lie back to back in gemm order (no strides, no offsets).
func (g gemmShape) packed() bool { return g.ldA == 0 && g.ldB == 0 && g.offA == nil && g.offB == nil }

// transposed returns the products Cᵀ[i] = op(B[i])ᵀ · op(A[i])ᵀ: B's memory read as the first operand and
// A's as the second, each with its transpose flag flipped, into C's memory read as [n, m] rows (ldC, offC
// then describe that layout). Each element is the same sum of the same products in the same order.
func (g gemmShape) transposed() gemmShape {
	return gemmShape{batch: g.batch, m: g.n, n: g.m, k: g.k, transA: !g.transB, transB: !g.transA,
		ldA: g.ldB, ldB: g.ldA, ldC: g.ldC, offA: g.offB, offB: g.offA, offC: g.offC}
}

func pick(cond bool, ifTrue, ifFalse int) int {
	if cond {
		return ifTrue
	}
	return ifFalse
}

// gemmPlan is how one DotGeneral runs as a gemmShape: each operand is used in place, or first copied into
// gemm order with the given axes permutation (output axis i is input axis permutation[i]).
type gemmPlan struct {
	gemm                           gemmShape
	lhsPermutation, rhsPermutation []int
}

// operandLayout is how one DotGeneral operand maps onto a gemm operand.
type operandLayout struct {
	// contractingLast: the operand is [batch, rows, contracting] (false: [batch, contracting, rows]).
	contractingLast bool
	// permutation is non-nil when the operand must be copied into gemm order first.
	permutation []int
	// ld and offsets are non-zero when the operand is used in place with strides: its gemm rows lie ld
	// elements apart and batch item i starts at offsets[i] (see gemmShape).
	ld      int
	offsets []int64
}

// planGemm maps a DotGeneral (operand dimensions plus simplego's axes) onto a gemmShape. allowCopy permits
// copying operands whose layout no gemm transpose flag covers. It reports false if the DotGeneral cannot run
// as a gemm, e.g. axes not consistent with the sizes simplego computed.
func planGemm(lhsDims, rhsDims []int, params *dotGeneralParams, allowCopy bool) (gemmPlan, bool) {
	numBatch, numContracting := len(params.lhsBatchAxes), len(params.lhsContractingAxes)
	if len(params.rhsBatchAxes) != numBatch || len(params.rhsContractingAxes) != numContracting {
		return gemmPlan{}, false
	}
	if !sizesMatch(lhsDims, params.lhsBatchAxes, params.lhsContractingAxes, params.lhsCrossSize, params) ||
		!sizesMatch(rhsDims, params.rhsBatchAxes, params.rhsContractingAxes, params.rhsCrossSize, params) {
		return gemmPlan{}, false
	}

	// The contracting axes are paired by position (lhsContractingAxes[i] with rhsContractingAxes[i]); any
	// order of the pairs flattens to the same contraction. Try the order that keeps the lhs axes in memory
	// order and the one that keeps the rhs axes in memory order, and keep the cheaper plan.
	var best gemmPlan
	bestCopied := -1
	for _, order := range [][]int{sortedOrder(params.lhsContractingAxes), sortedOrder(params.rhsContractingAxes)} {
		lhs := layoutOperand(lhsDims, params.lhsBatchAxes, permute(params.lhsContractingAxes, order), true)
		rhs := layoutOperand(rhsDims, params.rhsBatchAxes, permute(params.rhsContractingAxes, order), false)
		copied := 0
		if lhs.permutation != nil {
			copied += product(lhsDims)
		}
		if rhs.permutation != nil {
			copied += product(rhsDims)
		}
		if bestCopied >= 0 && copied >= bestCopied {
			continue
		}
		bestCopied = copied
		best = gemmPlan{
			gemm: gemmShape{
				batch: params.batchSize, m: params.lhsCrossSize, n: params.rhsCrossSize, k: params.contractingSize,
				transA: !lhs.contractingLast, transB: rhs.contractingLast,
				ldA: lhs.ld, ldB: rhs.ld, offA: lhs.offsets, offB: rhs.offsets,
			},
			lhsPermutation: lhs.permutation,
			rhsPermutation: rhs.permutation,
		}
	}
	if !allowCopy && bestCopied > 0 {
		return gemmPlan{}, false
	}
	return best, true
}

// layoutOperand finds how an operand of the given dimensions, with batch axes (in output order) and
// contracting axes (in pair order), maps onto a gemm operand. isLHS picks the no-transpose form when both
// forms fit (no rows axes): lhs [batch, rows, contracting], rhs [batch, contracting, rows].
func layoutOperand(dims, batchAxes, contractingAxes []int, isLHS bool) operandLayout {
	rank := len(dims)
	numBatch, numContracting := len(batchAxes), len(contractingAxes)
	rowsAxes := rowsAxesOf(rank, batchAxes, contractingAxes)
	inPlace := true
	for i, axis := range batchAxes {
		inPlace = inPlace && axis == i
	}
	for i, axis := range contractingAxes {
		inPlace = inPlace && axis == contractingAxes[0]+i
	}
	if numContracting == 0 || len(rowsAxes) == 0 {
		// One of the two gemm dimensions is 1: both forms have the same memory order.
		if inPlace {
			return operandLayout{contractingLast: isLHS}
		}
		return operandLayout{contractingLast: isLHS,
			permutation: gemmOrder(batchAxes, rowsAxes, contractingAxes, isLHS)}
	}
	if inPlace {
		switch {
		case contractingAxes[0]+numContracting == rank:
			return operandLayout{contractingLast: true}
		case contractingAxes[0] == numBatch:
			return operandLayout{contractingLast: false}
		}
	}
	if layout, ok := stridedLayout(dims, batchAxes, rowsAxes, contractingAxes); ok {
		return layout
	}
	// Copy into the form closest to the memory order, so the copy moves whole rows where it can (e.g. only
	// the batch axes move) and the gemm transpose flag absorbs the rest.
	contractingLast := slices.Min(contractingAxes) > rowsAxes[0]
	return operandLayout{contractingLast: contractingLast,
		permutation: gemmOrder(batchAxes, rowsAxes, contractingAxes, contractingLast)}
}

// stridedLayout uses an operand in place when only its batch axes are out of gemm order: the rows axes and
// the contracting axes each merge into one matrix dimension (consecutive axes, the contracting ones in pair
// order), and the operand's last axis closes one of them, so the matrix has unit column stride and a row
// stride (ld) the gemm takes as it is. Each batch item starts at the offset its batch indices give. This is
// attention's layout: queries [batch, seq, heads, dim] with batch axes (batch, heads) are batch·heads
// matrices [seq, dim] with rows heads·dim apart, which otherwise would be copied on every product.
func stridedLayout(dims, batchAxes, rowsAxes, contractingAxes []int) (operandLayout, bool) {
	if len(rowsAxes) == 0 || len(contractingAxes) == 0 {
		return operandLayout{}, false
	}
	consecutive := func(axes []int) bool {
		for i := 1; i < len(axes); i++ {
			if axes[i] != axes[i-1]+1 {
				return false
			}
		}
		return true
	}
	if !consecutive(rowsAxes) || !consecutive(contractingAxes) {
		return operandLayout{}, false
	}
	last := len(dims) - 1
	strides := rowMajorStrides(dims)
	var layout operandLayout
	switch {
	case contractingAxes[len(contractingAxes)-1] == last:
		layout = operandLayout{contractingLast: true, ld: strides[rowsAxes[len(rowsAxes)-1]]}
	case rowsAxes[len(rowsAxes)-1] == last:
		layout = operandLayout{contractingLast: false, ld: strides[contractingAxes[len(contractingAxes)-1]]}
	default:
		return operandLayout{}, false
	}
	// Batch item offsets: the batch indices in output order, the last running fastest.
	count := 1
	for _, axis := range batchAxes {
		count *= dims[axis]
	}
	layout.offsets = make([]int64, count)
	for i := range count {
		offset, rest := 0, i
		for j := len(batchAxes) - 1; j >= 0; j-- {
			axis := batchAxes[j]
			offset += rest % dims[axis] * strides[axis]
			rest /= dims[axis]
		}
		layout.offsets[i] = int64(offset)
	}
	return layout, true
}

// rowMajorStrides returns the element stride of each axis of a row-major array of the given dimensions.
func rowMajorStrides(dims []int) []int {
	strides := make([]int, len(dims))
	stride := 1
	for axis := len(dims) - 1; axis >= 0; axis-- {
		strides[axis] = stride
		stride *= dims[axis]
	}
	return strides
}

// rowsAxesOf returns the axes that are neither batch nor contracting (DotGeneral's cross axes), in order.
func rowsAxesOf(rank int, batchAxes, contractingAxes []int) []int {
	var rowsAxes []int
	for axis := range rank {
		if !slices.Contains(batchAxes, axis) && !slices.Contains(contractingAxes, axis) {
			rowsAxes = append(rowsAxes, axis)
		}
	}
	return rowsAxes
}

// gemmOrder is the axes permutation that copies an operand into gemm order: batch axes, then the rows axes
// in memory order and the contracting axes in pair order, the latter last or first. It returns nil if that
// order is already the memory order.
func gemmOrder(batchAxes, rowsAxes, contractingAxes []int, contractingLast bool) []int {
	order := slices.Clone(batchAxes)
	if contractingLast {
		order = append(append(order, rowsAxes...), contractingAxes...)
	} else {
		order = append(append(order, contractingAxes...), rowsAxes...)
	}
	for i, axis := range order {
		if axis != i {
			return order
		}
	}
	return nil
}

// sizesMatch checks an operand against the sizes simplego computed for the DotGeneral, so that a layout
// inconsistent with them (e.g. repeated axes) is left to simplego rather than read out of bounds.
func sizesMatch(dims, batchAxes, contractingAxes []int, crossSize int, params *dotGeneralParams) bool {
	const cross, batch, contracting = 0, 1, 2
	kinds := make([]int, len(dims))
	for kind, axes := range [...][]int{batch: batchAxes, contracting: contractingAxes} {
		for _, axis := range axes {
			if axis < 0 || axis >= len(dims) || kinds[axis] != cross {
				return false
			}
			kinds[axis] = kind
		}
	}
	sizes := [3]int{1, 1, 1}
	for axis, dim := range dims {
		sizes[kinds[axis]] *= dim
	}
	return sizes[cross] == crossSize && sizes[batch] == params.batchSize && sizes[contracting] == params.contractingSize
}

// sortedOrder returns the indices of axes sorted by axis.
func sortedOrder(axes []int) []int {
	order := make([]int, len(axes))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return axes[a] - axes[b] })
	return order
}

// permute returns values reordered by order.
func permute(values, order []int) []int {
	permuted := make([]int, len(order))
	for i, j := range order {
		permuted[i] = values[j]
	}
	return permuted
}

func product(dims []int) int {
	size := 1
	for _, dim := range dims {
		size *= dim
	}
	return size
}
