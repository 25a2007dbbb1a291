package gemmgrad

import (
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// GoMLX (v0.26.0) keeps an op's static parameters in the unexported field graph.Node.inputs, an interface
// holding a pointer to an op-specific struct; for DotGeneral that struct is nodeInputsDotGeneral, with the
// axes below as []int. These names are everything this package relies on beyond GoMLX's public API, and
// CheckCompatible verifies them. reflect may read unexported fields (Len, Index, Int) though not hand them
// out as interfaces, which is all this needs.
const (
	nodeInputsField          = "inputs"
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
	inputs := reflect.ValueOf(node).Elem().FieldByName(nodeInputsField)
	if !inputs.IsValid() {
		return dotAxes{}, fmt.Errorf("graph.Node has no field %q", nodeInputsField)
	}
	if inputs.Kind() != reflect.Interface {
		return dotAxes{}, fmt.Errorf("graph.Node.%s is a %s, not an interface", nodeInputsField, inputs.Kind())
	}
	if inputs.IsNil() {
		return dotAxes{}, fmt.Errorf("graph.Node.%s of %s node is nil", nodeInputsField, node.Type())
	}
	params := inputs.Elem()
	if params.Kind() != reflect.Pointer || params.IsNil() || params.Elem().Kind() != reflect.Struct {
		return dotAxes{}, fmt.Errorf("graph.Node.%s of %s node holds a %s, not a pointer to a struct",
			nodeInputsField, node.Type(), params.Type())
	}
	params = params.Elem()
	if params.Type().Name() != dotGeneralInputsTypeName || params.Type().PkgPath() != graphPackagePath {
		return dotAxes{}, fmt.Errorf("the parameters of %s node are a %s, not %s.%s",
			node.Type(), params.Type(), graphPackagePath, dotGeneralInputsTypeName)
	}

	var axes dotAxes
	for _, target := range []struct {
		field string
		into  *[]int
	}{
		{lhsContractingAxesField, &axes.lhsContracting},
		{lhsBatchAxesField, &axes.lhsBatch},
		{rhsContractingAxesField, &axes.rhsContracting},
		{rhsBatchAxesField, &axes.rhsBatch},
	} {
		field, into := target.field, target.into
		values := params.FieldByName(field)
		if !values.IsValid() {
			return dotAxes{}, fmt.Errorf("%s has no field %q", params.Type(), field)
		}
		if values.Kind() != reflect.Slice || values.Type().Elem().Kind() != reflect.Int {
			return dotAxes{}, fmt.Errorf("%s.%s is a %s, not a []int", params.Type(), field, values.Type())
		}
		*into = make([]int, values.Len())
		for i := range *into {
			(*into)[i] = int(values.Index(i).Int())
		}
	}
	return axes, nil
}

// graphPackagePath is the import path of GoMLX's graph package, where nodeInputsDotGeneral is declared.
var graphPackagePath = reflect.TypeFor[graph.Node]().PkgPath()

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

var compatibility = sync.OnceValue(probeCompatibility)

func probeCompatibility() (err error) {
	defer func() {
		// Graph building reports errors by panicking.
		if r := recover(); r != nil {
			err = fmt.Errorf("gemmgrad: building the compatibility probe: %v", r)
		}
	}()
	field, ok := reflect.TypeFor[graph.Node]().FieldByName(nodeInputsField)
	if !ok || field.Type.Kind() != reflect.Interface {
		return fmt.Errorf("gemmgrad: graph.Node has no interface field %q holding the DotGeneral axes", nodeInputsField)
	}

	backend, err := simplego.New("")
	if err != nil {
		return fmt.Errorf("gemmgrad: creating the pure-Go backend to probe DotGeneral nodes: %w", err)
	}
	defer backend.Finalize()
	g := graph.NewGraph(backend, "gemmgrad_compatibility_probe")
	defer g.Finalize()

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
