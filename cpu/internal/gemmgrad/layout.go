package gemmgrad

import (
	"fmt"
	"slices"
	"sync"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// GoMLX (v0.26.0) keeps a DotGeneral's axes, as []int, in its node parameters (see gomlxpatch) of type
// nodeInputsDotGeneral with the fields below. These names are everything this package relies on beyond
// GoMLX's public API, and CheckCompatible verifies them.
const (
	dotGeneralInputsTypeName = "nodeInputsDotGeneral"
	lhsContractingAxesField  = "lhsContractingAxes"
	lhsBatchAxesField        = "lhsBatchAxes"
	rhsContractingAxesField  = "rhsContractingAxes"
	rhsBatchAxesField        = "rhsBatchAxes"
)

// dotAxes describes a DotGeneral: axis lhsContracting[i] of lhs is contracted with axis rhsContracting[i]
// of rhs, lhsBatch[i] is aligned with rhsBatch[i], and every other axis of an operand is a cross axis.
type dotAxes struct {
	lhsContracting, lhsBatch, rhsContracting, rhsBatch []int
}

// readDotGeneralAxes reads the axes of a DotGeneral node from GoMLX's unexported node parameters.
func readDotGeneralAxes(node *graph.Node) (dotAxes, error) {
	r, err := gomlxpatch.NewParamsReader(node, dotGeneralInputsTypeName)
	if err != nil {
		return dotAxes{}, err
	}
	axes := dotAxes{
		lhsContracting: r.Ints(lhsContractingAxesField),
		lhsBatch:       r.Ints(lhsBatchAxesField),
		rhsContracting: r.Ints(rhsContractingAxesField),
		rhsBatch:       r.Ints(rhsBatchAxesField),
	}
	if r.Err != nil {
		return dotAxes{}, r.Err
	}
	return axes, nil
}

// validate checks that the axes describe a DotGeneral of operands shaped lhs and rhs into output: axes in
// range and used once per operand, paired axes of equal dimension, and output laid out
// [batch..., lhs cross..., rhs cross...]. Axes read from the wrong fields or meaning something else would
// almost always fail one of these.
func (a dotAxes) validate(lhs, rhs, output shapes.Shape) error {
	if len(a.lhsContracting) != len(a.rhsContracting) || len(a.lhsBatch) != len(a.rhsBatch) {
		return fmt.Errorf("lhs has %d contracting and %d batch axes, rhs %d and %d",
			len(a.lhsContracting), len(a.lhsBatch), len(a.rhsContracting), len(a.rhsBatch))
	}
	if lhs.DType != output.DType || rhs.DType != output.DType {
		return fmt.Errorf("dtypes differ: lhs %s, rhs %s, output %s", lhs.DType, rhs.DType, output.DType)
	}
	for _, operand := range []struct {
		name               string
		shape              shapes.Shape
		contracting, batch []int
	}{
		{"lhs", lhs, a.lhsContracting, a.lhsBatch},
		{"rhs", rhs, a.rhsContracting, a.rhsBatch},
	} {
		used := make([]bool, operand.shape.Rank())
		for _, axis := range slices.Concat(operand.contracting, operand.batch) {
			if axis < 0 || axis >= len(used) || used[axis] {
				return fmt.Errorf("%s axes contracting=%v batch=%v are out of range or repeated for rank %d",
					operand.name, operand.contracting, operand.batch, len(used))
			}
			used[axis] = true
		}
	}
	for _, pairs := range [][2][]int{{a.lhsContracting, a.rhsContracting}, {a.lhsBatch, a.rhsBatch}} {
		for i, lhsAxis := range pairs[0] {
			if lhs.Dimensions[lhsAxis] != rhs.Dimensions[pairs[1][i]] {
				return fmt.Errorf("lhs axis %d (dimension %d) is paired with rhs axis %d (dimension %d)",
					lhsAxis, lhs.Dimensions[lhsAxis], pairs[1][i], rhs.Dimensions[pairs[1][i]])
			}
		}
	}
	wantDims := make([]int, 0, output.Rank())
	for _, axis := range a.lhsBatch {
		wantDims = append(wantDims, lhs.Dimensions[axis])
	}
	for _, axis := range crossAxes(lhs.Rank(), a.lhsContracting, a.lhsBatch) {
		wantDims = append(wantDims, lhs.Dimensions[axis])
	}
	for _, axis := range crossAxes(rhs.Rank(), a.rhsContracting, a.rhsBatch) {
		wantDims = append(wantDims, rhs.Dimensions[axis])
	}
	if !slices.Equal(wantDims, output.Dimensions) {
		return fmt.Errorf("operands %s and %s with %+v give dimensions %v, but the output is %s",
			lhs, rhs, a, wantDims, output)
	}
	return nil
}

// CheckCompatible reports whether the GoMLX in use stores DotGeneral axes where this package reads them.
// It builds, without running, a DotGeneral with unsorted contracting axes and a batch axis that is not
// leading on the pure-Go backend, reads the axes back, and compares them with those it passed; it also
// checks that Dot nodes still expose both operands. A non-nil error names what changed. The result is
// computed once per process; Register panics with it.
func CheckCompatible() error { return compatibility() }

var compatibility = sync.OnceValue(func() error {
	return gomlxpatch.Probe("gemmgrad", "the DotGeneral axes", probeDotGeneral)
})

// probeDotGeneral builds a DotGeneral and a Dot in g and checks how they read back.
func probeDotGeneral(g *graph.Graph) error {
	want := dotAxes{lhsContracting: []int{3, 1}, lhsBatch: []int{2}, rhsContracting: []int{0, 3}, rhsBatch: []int{1}}
	lhs := graph.Parameter(g, "lhs", shapes.Make(dtypes.Float32, 2, 3, 4, 5))
	rhs := graph.Parameter(g, "rhs", shapes.Make(dtypes.Float32, 5, 4, 6, 3))
	dotGeneral := graph.DotGeneral(lhs, slices.Clone(want.lhsContracting), slices.Clone(want.lhsBatch),
		rhs, slices.Clone(want.rhsContracting), slices.Clone(want.rhsBatch))
	if dotGeneral.Type() != graph.NodeTypeDotGeneral {
		return fmt.Errorf("gemmgrad: graph.DotGeneral built a %s node, not %s", dotGeneral.Type(), graph.NodeTypeDotGeneral)
	}
	got, err := readDotGeneralAxes(dotGeneral)
	if err != nil {
		return fmt.Errorf("gemmgrad: reading DotGeneral axes: %w", err)
	}
	if !slices.Equal(got.lhsContracting, want.lhsContracting) || !slices.Equal(got.lhsBatch, want.lhsBatch) ||
		!slices.Equal(got.rhsContracting, want.rhsContracting) || !slices.Equal(got.rhsBatch, want.rhsBatch) {
		return fmt.Errorf("gemmgrad: DotGeneral built with axes %+v reads back as %+v", want, got)
	}
	if inputs := dotGeneral.Inputs(); len(inputs) != 2 || inputs[0] != lhs || inputs[1] != rhs {
		return fmt.Errorf("gemmgrad: DotGeneral node inputs are not [lhs, rhs]")
	}

	matrix := graph.Parameter(g, "matrix", shapes.Make(dtypes.Float32, 6, 5))
	dot := graph.Dot(matrix, graph.Transpose(matrix, 0, 1))
	if inputs := dot.Inputs(); dot.Type() != graph.NodeTypeDot || len(inputs) != 2 || inputs[0] != matrix {
		return fmt.Errorf("gemmgrad: graph.Dot built a %s node with inputs %v, not a %s node of [lhs, rhs]",
			dot.Type(), inputs, graph.NodeTypeDot)
	}
	return nil
}
