package gomlxpatch

import (
	"fmt"
	"reflect"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/graph"
)

// GoMLX (v0.26.0) keeps an op's static parameters in the unexported field graph.Node.inputs, an interface
// holding a pointer to an op-specific struct graph.nodeInputs<Op>. reflect may read unexported fields (Len,
// Index, Int) though not hand them out as interfaces, which is all ParamsReader needs.
const NodeInputsField = "inputs"

// GraphPackagePath is the import path of GoMLX's graph package, where the parameter structs are declared.
var GraphPackagePath = reflect.TypeFor[graph.Node]().PkgPath()

// Probe runs build on a fresh graph of the pure-Go backend, for a package (named name) to check that the
// GoMLX in use stores node parameters where it reads them; what names those parameters in the errors. A
// panic while building, which is how graph building reports errors, is returned as an error.
func Probe(name, what string, build func(g *graph.Graph) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: building the compatibility probe: %v", name, r)
		}
	}()
	if field, ok := reflect.TypeFor[graph.Node]().FieldByName(NodeInputsField); !ok || field.Type.Kind() != reflect.Interface {
		return fmt.Errorf("%s: graph.Node has no interface field %q holding %s", name, NodeInputsField, what)
	}
	backend, err := simplego.New("")
	if err != nil {
		return fmt.Errorf("%s: creating the pure-Go backend to probe %s: %w", name, what, err)
	}
	defer backend.Finalize()
	g := graph.NewGraph(backend, name+"_compatibility_probe")
	defer g.Finalize()
	return build(g)
}

// ParamsReader reads fields of one node's parameter struct, keeping the first failure in Err so that a
// whole struct can be read before checking.
type ParamsReader struct {
	Params reflect.Value // The struct read: nodeInputs<Op>, or a struct-valued field of it.
	Err    error
}

// NewParamsReader returns a reader of node's parameter struct, which must be graph.<typeName>.
func NewParamsReader(node *graph.Node, typeName string) (*ParamsReader, error) {
	inputs := reflect.ValueOf(node).Elem().FieldByName(NodeInputsField)
	if !inputs.IsValid() {
		return nil, fmt.Errorf("graph.Node has no field %q", NodeInputsField)
	}
	if inputs.Kind() != reflect.Interface {
		return nil, fmt.Errorf("graph.Node.%s is a %s, not an interface", NodeInputsField, inputs.Kind())
	}
	if inputs.IsNil() {
		return nil, fmt.Errorf("graph.Node.%s of %s node is nil", NodeInputsField, node.Type())
	}
	return structReader(inputs.Elem(), GraphPackagePath, typeName,
		fmt.Sprintf("graph.Node.%s of %s node", NodeInputsField, node.Type()))
}

// structReader returns a reader of the struct ptr points to, which must be pkgPath.typeName; what names
// the value in errors.
func structReader(ptr reflect.Value, pkgPath, typeName, what string) (*ParamsReader, error) {
	if ptr.Kind() != reflect.Pointer || ptr.IsNil() || ptr.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("%s holds a %s, not a pointer to a struct", what, ptr.Type())
	}
	params := ptr.Elem()
	if params.Type().Name() != typeName || params.Type().PkgPath() != pkgPath {
		return nil, fmt.Errorf("%s is a %s, not %s.%s", what, params.Type(), pkgPath, typeName)
	}
	return &ParamsReader{Params: params}, nil
}

// Field returns the named field of the struct if it is of the given kind, else records an error. It reads
// nothing once an error is recorded.
func (r *ParamsReader) Field(name string, kind reflect.Kind) (reflect.Value, bool) {
	if r.Err != nil {
		return reflect.Value{}, false
	}
	value := r.Params.FieldByName(name)
	if !value.IsValid() {
		r.Err = fmt.Errorf("%s has no field %q", r.Params.Type(), name)
		return reflect.Value{}, false
	}
	if value.Kind() != kind {
		r.Err = fmt.Errorf("%s.%s is a %s, not a %s", r.Params.Type(), name, value.Type(), kind)
		return reflect.Value{}, false
	}
	return value, true
}

// Int reads an int field.
func (r *ParamsReader) Int(name string) int {
	return r.TypedInt(name, reflect.TypeFor[int]())
}

// TypedInt reads an integer field whose type must be exactly want (int, or a named int type).
func (r *ParamsReader) TypedInt(name string, want reflect.Type) int {
	value, ok := r.Field(name, want.Kind())
	if !ok {
		return 0
	}
	if value.Type() != want {
		r.Err = fmt.Errorf("%s.%s is a %s, not a %s", r.Params.Type(), name, value.Type(), want)
		return 0
	}
	return int(value.Int())
}

// Ints reads a []int field; a nil or empty slice reads as nil.
func (r *ParamsReader) Ints(name string) []int {
	value, ok := r.Field(name, reflect.Slice)
	if !ok {
		return nil
	}
	if value.Type().Elem().Kind() != reflect.Int {
		r.Err = fmt.Errorf("%s.%s is a %s, not a []int", r.Params.Type(), name, value.Type())
		return nil
	}
	if value.Len() == 0 {
		return nil
	}
	ints := make([]int, value.Len())
	for i := range ints {
		ints[i] = int(value.Index(i).Int())
	}
	return ints
}

// Pairs reads a [][2]int field; a nil or empty slice reads as nil.
func (r *ParamsReader) Pairs(name string) [][2]int {
	value, ok := r.Field(name, reflect.Slice)
	if !ok {
		return nil
	}
	if elem := value.Type().Elem(); elem.Kind() != reflect.Array || elem.Len() != 2 || elem.Elem().Kind() != reflect.Int {
		r.Err = fmt.Errorf("%s.%s is a %s, not a [][2]int", r.Params.Type(), name, value.Type())
		return nil
	}
	if value.Len() == 0 {
		return nil
	}
	pairs := make([][2]int, value.Len())
	for i := range pairs {
		pairs[i] = [2]int{int(value.Index(i).Index(0).Int()), int(value.Index(i).Index(1).Int())}
	}
	return pairs
}

// Struct reads the named struct-valued field, whose type must be exactly want, by handing a reader of it to
// read; the first failure of either is recorded in r.Err.
func (r *ParamsReader) Struct(name string, want reflect.Type, read func(fields *ParamsReader)) {
	value, ok := r.Field(name, reflect.Struct)
	if !ok {
		return
	}
	if value.Type() != want {
		r.Err = fmt.Errorf("%s.%s is a %s, not a %s", r.Params.Type(), name, value.Type(), want)
		return
	}
	fields := &ParamsReader{Params: value}
	read(fields)
	r.Err = fields.Err
}

// SimplegoPackagePath is the import path of GoMLX's pure-Go backend, where the parameter structs of its
// nodes (NodeData) are declared.
const SimplegoPackagePath = "github.com/gomlx/gomlx/backends/simplego"

// NewNodeDataReader returns a reader of a simplego node's parameter struct (NodeData), which must be a
// pointer to simplego.<typeName>.
func NewNodeDataReader(data any, typeName string) (*ParamsReader, error) {
	if data == nil {
		return nil, fmt.Errorf("a simplego node has no data, not a %s.%s", SimplegoPackagePath, typeName)
	}
	return structReader(reflect.ValueOf(data), SimplegoPackagePath, typeName, "a simplego node's data")
}
