package blas

import (
	"github.com/gomlx/gomlx/backends/simplego"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// dotGeneralParams mirrors the leading fields of simplego's unexported dotGeneralNodeData, which
// Builder.DotGeneral stores (as a pointer) in the DotGeneral node's data field. Only this prefix is read;
// the mirror checks names, types and offsets against the real struct before any read.
type dotGeneralParams struct {
	lhsContractingAxes, lhsBatchAxes                       []int
	rhsContractingAxes, rhsBatchAxes                       []int
	batchSize, lhsCrossSize, rhsCrossSize, contractingSize int
}

var dotGeneralMirror = gomlxpatch.DataMirror[dotGeneralParams]{TypeName: "dotGeneralNodeData"}

// dotGeneralParamsOf returns the axes and sizes of a DotGeneral node, or nil if its data is not the struct
// the mirror accepts (then the caller falls back to simplego's own executor).
func dotGeneralParamsOf(node *simplego.Node) *dotGeneralParams { return dotGeneralMirror.Of(node) }
