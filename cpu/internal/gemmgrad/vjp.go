package gemmgrad

import (
	"fmt"
	"slices"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// gemmVJP returns the graph.VJP installed for Dot and DotGeneral nodes. Nodes that gemmGradients does not
// handle go to fallback, the VJP it replaces.
func gemmVJP(fallback graph.VJP) graph.VJP {
	return gomlxpatch.WithFallback("gemmgrad",
		func(node *graph.Node, outputVJPs []*graph.Node, _ shapes.Shape) ([]*graph.Node, bool) {
			return gemmGradients(node, outputVJPs)
		}, fallback)
}

// gemmGradients returns the gradients of node's operands (a Dot or DotGeneral node) given outputVJPs, the
// gradient arriving at its output, each built as one DotGeneral and at most one Transpose. It returns false
// for nodes it leaves to GoMLX's own VJP: dtypes other than real floats (complex gradients need
// conjugation, integer gradients are not worth a gemm), Dot operands of rank other than 1 or 2, or an
// incoming gradient whose shape is not the output's.
//
// It panics when a node's axes cannot be read or contradict its shapes: that means GoMLX changed how it
// stores them, and falling back quietly would hide it.
func gemmGradients(node *graph.Node, outputVJPs []*graph.Node) ([]*graph.Node, bool) {
	inputs := node.Inputs()
	if len(outputVJPs) != 1 || outputVJPs[0] == nil || len(inputs) != 2 {
		return nil, false
	}
	v, lhs, rhs := outputVJPs[0], inputs[0], inputs[1]
	dtype := node.DType()
	if !dtype.IsFloat() || lhs.DType() != dtype || rhs.DType() != dtype || !v.Shape().Equal(node.Shape()) {
		return nil, false
	}

	var axes dotAxes
	switch node.Type() {
	case graph.NodeTypeDot:
		if !isVectorOrMatrix(lhs) || !isVectorOrMatrix(rhs) {
			return nil, false
		}
		// Dot contracts the last axis of lhs with the first of rhs, without batch axes: vector·vector,
		// matrix·vector and matrix·matrix are all this DotGeneral.
		axes = dotAxes{lhsContracting: []int{lhs.Rank() - 1}, rhsContracting: []int{0}}
	case graph.NodeTypeDotGeneral:
		var err error
		if axes, err = readDotGeneralAxes(node); err != nil {
			panic(fmt.Sprintf("gemmgrad: %v; this GoMLX is not compatible with gemmgrad, call gemmgrad.Unregister", err))
		}
	default:
		return nil, false
	}
	if err := axes.validate(lhs.Shape(), rhs.Shape(), node.Shape()); err != nil {
		panic(fmt.Sprintf("gemmgrad: axes of %s node %s do not match its shapes: %v; "+
			"this GoMLX is not compatible with gemmgrad, call gemmgrad.Unregister", node.Type(), node, err))
	}

	lhsSide := operandAxes{
		batch:       axes.lhsBatch,
		contracting: axes.lhsContracting,
		cross:       crossAxes(lhs.Rank(), axes.lhsContracting, axes.lhsBatch),
	}
	rhsSide := operandAxes{
		batch:       axes.rhsBatch,
		contracting: axes.rhsContracting,
		cross:       crossAxes(rhs.Rank(), axes.rhsContracting, axes.rhsBatch),
	}
	// The output (and so v) is laid out [batch..., lhs cross..., rhs cross...].
	numBatch := len(axes.lhsBatch)
	vLhsCross := iota(numBatch, len(lhsSide.cross))
	vRhsCross := iota(numBatch+len(lhsSide.cross), len(rhsSide.cross))
	return []*graph.Node{
		operandGradient(v, vRhsCross, lhs.Rank(), lhsSide, rhs, rhsSide),
		operandGradient(v, vLhsCross, rhs.Rank(), rhsSide, lhs, lhsSide),
	}, true
}

func isVectorOrMatrix(x *graph.Node) bool { return x.Rank() == 1 || x.Rank() == 2 }

// operandAxes are the axes of one DotGeneral operand by role. batch and contracting are in pairing order
// (batch[i] of lhs pairs with batch[i] of rhs); cross is in increasing order, the order DotGeneral lays
// them out in its output.
type operandAxes struct {
	batch, contracting, cross []int
}

// operandGradient returns the gradient of one operand ("this", of rank thisRank) of a DotGeneral, given v,
// the gradient of its output, whose axes vOtherCross correspond to the other operand's cross axes.
//
// For each element, d this[batch, thisCross, contracting] = Σ over otherCross of
// v[batch, …cross…] · other[batch, contracting, otherCross]: a DotGeneral of v and other contracting
// their shared cross axes, batched over the batch axes. Its result holds this operand's axes grouped by
// role, [batch, thisCross, contracting] or [batch, contracting, thisCross] depending on which operand goes
// first, and a Transpose puts them back in this operand's order. The operand order that needs no Transpose
// is preferred: for a dense layer x·W that makes both gradients a single gemm.
func operandGradient(v *graph.Node, vOtherCross []int, thisRank int, this operandAxes,
	other *graph.Node, otherAxes operandAxes) *graph.Node {
	numBatch := len(this.batch)
	vBatch := iota(0, numBatch)

	// DotGeneral lays out the remaining (here: contracting) axes of other in increasing order, which is not
	// necessarily their pairing order: find where each of this operand's contracting axes lands.
	sortedOtherContracting := slices.Sorted(slices.Values(otherAxes.contracting))
	contractingRank := make([]int, len(this.contracting))
	for i, otherAxis := range otherAxes.contracting {
		contractingRank[i] = slices.Index(sortedOtherContracting, otherAxis)
	}

	// permutation[axis] is the axis of the gemm's result that holds this operand's axis, as TransposeAllAxes
	// wants it, for the gemm's result laid out [batch, first group, second group].
	permutation := func(crossFirst bool) []int {
		crossStart, contractingStart := numBatch, numBatch+len(this.cross)
		if !crossFirst {
			crossStart, contractingStart = numBatch+len(this.contracting), numBatch
		}
		perm := make([]int, thisRank)
		for i, axis := range this.batch {
			perm[axis] = i
		}
		for i, axis := range this.cross {
			perm[axis] = crossStart + i
		}
		for i, axis := range this.contracting {
			perm[axis] = contractingStart + contractingRank[i]
		}
		return perm
	}

	if perm := permutation(false); isIdentity(perm) {
		return graph.DotGeneral(other, otherAxes.cross, otherAxes.batch, v, vOtherCross, vBatch)
	}
	gradient := graph.DotGeneral(v, vOtherCross, vBatch, other, otherAxes.cross, otherAxes.batch)
	if perm := permutation(true); !isIdentity(perm) {
		gradient = graph.TransposeAllAxes(gradient, perm...)
	}
	return gradient
}

// crossAxes returns, in increasing order, the axes of an operand of the given rank that are neither
// contracting nor batch.
func crossAxes(rank int, contracting, batch []int) []int {
	cross := make([]int, 0, rank)
	for axis := range rank {
		if !slices.Contains(contracting, axis) && !slices.Contains(batch, axis) {
			cross = append(cross, axis)
		}
	}
	return cross
}

// iota returns [start, start+1, …, start+n-1].
func iota(start, n int) []int {
	axes := make([]int, n)
	for i := range axes {
		axes[i] = start + i
	}
	return axes
}

func isIdentity(perm []int) bool {
	for i, axis := range perm {
		if i != axis {
			return false
		}
	}
	return true
}
