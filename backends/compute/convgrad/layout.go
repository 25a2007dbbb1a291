package convgrad

import (
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// GoMLX (v0.26.0) keeps an op's static parameters in the unexported field graph.Node.inputs, an interface
// holding a pointer to an op-specific struct: nodeInputsConvGeneral and nodeInputsReduceWindow here, with
// the fields below. These names and kinds are everything this package relies on beyond GoMLX's public
// API, and CheckCompatible verifies them. reflect may read unexported fields (Len, Index, Int) though not
// hand them out as interfaces, which is all this needs.
const (
	nodeInputsField = "inputs"

	convGeneralInputsTypeName = "nodeInputsConvGeneral"
	convAxesField             = "axes"
	convStridesField          = "strides"
	convPaddingsField         = "paddings"
	convInputDilationsField   = "inputDilations"
	convKernelDilationsField  = "kernelDilations"
	convChannelGroupField     = "channelGroupCount"
	convBatchGroupField       = "batchGroupCount"

	reduceWindowInputsTypeName = "nodeInputsReduceWindow"
	poolReductionTypeField     = "reductionType"
	poolWindowDimensionsField  = "windowDimensions"
	poolStridesField           = "strides"
	poolBaseDilationsField     = "baseDilations"
	poolWindowDilationsField   = "windowDilations"
	poolPaddingsField          = "paddings"
)

// convParams are the static parameters of a ConvGeneral node, as passed to graph.ConvGeneral. Empty slices
// mean the default (stride 1, no padding, no dilation).
type convParams struct {
	axes                            backends.ConvolveAxesConfig
	strides                         []int
	paddings                        [][2]int
	inputDilations, kernelDilations []int
	channelGroupCount               int
	batchGroupCount                 int
}

// poolParams are the static parameters of a ReduceWindow node, one value per axis of the operand, as passed
// to graph.BackendReduceWindow. Empty slices mean the default (strides equal to the window, no dilation, no
// padding).
type poolParams struct {
	reduction                                                 backends.ReduceOpType
	windowDimensions, strides, baseDilations, windowDilations []int
	paddings                                                  [][2]int
}

// graphPackagePath is the import path of GoMLX's graph package, where the parameter structs are declared.
var graphPackagePath = reflect.TypeFor[graph.Node]().PkgPath()

// readConvParams reads the parameters of a ConvGeneral node from GoMLX's unexported node inputs.
func readConvParams(node *graph.Node) (convParams, error) {
	r, err := newParamsReader(node, convGeneralInputsTypeName)
	if err != nil {
		return convParams{}, err
	}
	p := convParams{
		axes:              r.convolveAxes(convAxesField),
		strides:           r.ints(convStridesField),
		paddings:          r.pairs(convPaddingsField),
		inputDilations:    r.ints(convInputDilationsField),
		kernelDilations:   r.ints(convKernelDilationsField),
		channelGroupCount: r.int(convChannelGroupField),
		batchGroupCount:   r.int(convBatchGroupField),
	}
	return p, r.err
}

// readPoolParams reads the parameters of a ReduceWindow node from GoMLX's unexported node inputs.
func readPoolParams(node *graph.Node) (poolParams, error) {
	r, err := newParamsReader(node, reduceWindowInputsTypeName)
	if err != nil {
		return poolParams{}, err
	}
	p := poolParams{
		reduction:        backends.ReduceOpType(r.typedInt(poolReductionTypeField, reflect.TypeFor[backends.ReduceOpType]())),
		windowDimensions: r.ints(poolWindowDimensionsField),
		strides:          r.ints(poolStridesField),
		baseDilations:    r.ints(poolBaseDilationsField),
		windowDilations:  r.ints(poolWindowDilationsField),
		paddings:         r.pairs(poolPaddingsField),
	}
	return p, r.err
}

// paramsReader reads fields of one node's parameter struct, keeping the first failure in err so that a
// whole struct can be read before checking.
type paramsReader struct {
	params reflect.Value // The struct nodeInputs<Op>.
	err    error
}

// newParamsReader returns a reader of node's parameter struct, which must be graph.<typeName>.
func newParamsReader(node *graph.Node, typeName string) (*paramsReader, error) {
	inputs := reflect.ValueOf(node).Elem().FieldByName(nodeInputsField)
	if !inputs.IsValid() {
		return nil, fmt.Errorf("graph.Node has no field %q", nodeInputsField)
	}
	if inputs.Kind() != reflect.Interface {
		return nil, fmt.Errorf("graph.Node.%s is a %s, not an interface", nodeInputsField, inputs.Kind())
	}
	if inputs.IsNil() {
		return nil, fmt.Errorf("graph.Node.%s of %s node is nil", nodeInputsField, node.Type())
	}
	params := inputs.Elem()
	if params.Kind() != reflect.Pointer || params.IsNil() || params.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("graph.Node.%s of %s node holds a %s, not a pointer to a struct",
			nodeInputsField, node.Type(), params.Type())
	}
	params = params.Elem()
	if params.Type().Name() != typeName || params.Type().PkgPath() != graphPackagePath {
		return nil, fmt.Errorf("the parameters of %s node are a %s, not %s.%s",
			node.Type(), params.Type(), graphPackagePath, typeName)
	}
	return &paramsReader{params: params}, nil
}

// field returns the named field of the struct if it is of the given kind, else records an error.
func (r *paramsReader) field(name string, kind reflect.Kind) (reflect.Value, bool) {
	if r.err != nil {
		return reflect.Value{}, false
	}
	return fieldOf(r.params, name, kind, &r.err)
}

// fieldOf returns the named field of the struct value if it is of the given kind, else sets *err.
func fieldOf(structValue reflect.Value, name string, kind reflect.Kind, err *error) (reflect.Value, bool) {
	value := structValue.FieldByName(name)
	if !value.IsValid() {
		*err = fmt.Errorf("%s has no field %q", structValue.Type(), name)
		return reflect.Value{}, false
	}
	if value.Kind() != kind {
		*err = fmt.Errorf("%s.%s is a %s, not a %s", structValue.Type(), name, value.Type(), kind)
		return reflect.Value{}, false
	}
	return value, true
}

func (r *paramsReader) int(name string) int {
	return r.typedInt(name, reflect.TypeFor[int]())
}

// typedInt reads an integer field whose type must be exactly want (int, or a named int type).
func (r *paramsReader) typedInt(name string, want reflect.Type) int {
	value, ok := r.field(name, want.Kind())
	if !ok {
		return 0
	}
	if value.Type() != want {
		r.err = fmt.Errorf("%s.%s is a %s, not a %s", r.params.Type(), name, value.Type(), want)
		return 0
	}
	return int(value.Int())
}

// ints reads a []int field; a nil or empty slice reads as nil.
func (r *paramsReader) ints(name string) []int {
	value, ok := r.field(name, reflect.Slice)
	if !ok {
		return nil
	}
	if value.Type().Elem().Kind() != reflect.Int {
		r.err = fmt.Errorf("%s.%s is a %s, not a []int", r.params.Type(), name, value.Type())
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

// pairs reads a [][2]int field; a nil or empty slice reads as nil.
func (r *paramsReader) pairs(name string) [][2]int {
	value, ok := r.field(name, reflect.Slice)
	if !ok {
		return nil
	}
	if elem := value.Type().Elem(); elem.Kind() != reflect.Array || elem.Len() != 2 || elem.Elem().Kind() != reflect.Int {
		r.err = fmt.Errorf("%s.%s is a %s, not a [][2]int", r.params.Type(), name, value.Type())
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

// convolveAxes reads a backends.ConvolveAxesConfig field, one exported field at a time since the value as a
// whole cannot be taken out of an unexported field.
func (r *paramsReader) convolveAxes(name string) backends.ConvolveAxesConfig {
	value, ok := r.field(name, reflect.Struct)
	if !ok {
		return backends.ConvolveAxesConfig{}
	}
	if want := reflect.TypeFor[backends.ConvolveAxesConfig](); value.Type() != want {
		r.err = fmt.Errorf("%s.%s is a %s, not a %s", r.params.Type(), name, value.Type(), want)
		return backends.ConvolveAxesConfig{}
	}
	var axes backends.ConvolveAxesConfig
	for _, target := range []struct {
		field string
		into  *int
	}{
		{"InputBatch", &axes.InputBatch}, {"InputChannels", &axes.InputChannels},
		{"KernelInputChannels", &axes.KernelInputChannels}, {"KernelOutputChannels", &axes.KernelOutputChannels},
		{"OutputBatch", &axes.OutputBatch}, {"OutputChannels", &axes.OutputChannels},
	} {
		if field, ok := fieldOf(value, target.field, reflect.Int, &r.err); ok {
			*target.into = int(field.Int())
		}
	}
	for _, target := range []struct {
		field string
		into  *[]int
	}{
		{"InputSpatial", &axes.InputSpatial}, {"KernelSpatial", &axes.KernelSpatial}, {"OutputSpatial", &axes.OutputSpatial},
	} {
		if field, ok := fieldOf(value, target.field, reflect.Slice, &r.err); ok {
			*target.into = make([]int, field.Len())
			for i := range *target.into {
				(*target.into)[i] = int(field.Index(i).Int())
			}
		}
	}
	return axes
}

// CheckCompatible reports whether the GoMLX in use stores ConvGeneral and ReduceWindow parameters where this
// package reads them. It builds, without running, a ConvGeneral and a ReduceWindow with a distinct value in
// every parameter on the pure-Go backend, reads the parameters back, and compares them with those it
// passed. A non-nil error names what changed. The result is computed once per process; Register panics
// with it.
func CheckCompatible() error { return compatibility() }

var compatibility = sync.OnceValue(func() error { return probeCompatibility(readConvParams, readPoolParams) })

// probeCompatibility checks that readConv and readPool read back the parameters of freshly built nodes; the
// readers are parameters so that a test can show a changed layout is caught.
func probeCompatibility(readConv func(*graph.Node) (convParams, error),
	readPool func(*graph.Node) (poolParams, error)) (err error) {
	if field, ok := reflect.TypeFor[graph.Node]().FieldByName(nodeInputsField); !ok || field.Type.Kind() != reflect.Interface {
		return fmt.Errorf("convgrad: graph.Node has no interface field %q holding node parameters", nodeInputsField)
	}

	backend, err := simplego.New("")
	if err != nil {
		return fmt.Errorf("convgrad: creating the pure-Go backend to probe node parameters: %w", err)
	}
	defer backend.Finalize()
	g := graph.NewGraph(backend, "convgrad_compatibility_probe")
	defer g.Finalize()
	defer func() {
		// Graph building reports errors by panicking.
		if r := recover(); r != nil {
			err = fmt.Errorf("convgrad: building the compatibility probe: %v", r)
		}
	}()

	// A channels-first 2D convolution with every parameter distinct from its default and from the others.
	wantConv := convParams{
		axes: backends.ConvolveAxesConfig{
			InputBatch: 0, InputChannels: 1, InputSpatial: []int{2, 3},
			KernelInputChannels: 1, KernelOutputChannels: 0, KernelSpatial: []int{2, 3},
			OutputBatch: 0, OutputChannels: 1, OutputSpatial: []int{2, 3},
		},
		strides:           []int{2, 1},
		paddings:          [][2]int{{1, 2}, {0, 3}},
		inputDilations:    []int{1, 2},
		kernelDilations:   []int{1, 3},
		channelGroupCount: 2,
		batchGroupCount:   1,
	}
	x := graph.Parameter(g, "x", shapes.Make(dtypes.Float32, 2, 4, 9, 8))
	kernel := graph.Parameter(g, "kernel", shapes.Make(dtypes.Float32, 6, 2, 3, 2))
	conv := graph.ConvGeneral(x, kernel, wantConv.axes.Clone(), slices.Clone(wantConv.strides),
		slices.Clone(wantConv.paddings), slices.Clone(wantConv.inputDilations), slices.Clone(wantConv.kernelDilations),
		wantConv.channelGroupCount, wantConv.batchGroupCount)
	if conv.Type() != graph.NodeTypeConvGeneral {
		return fmt.Errorf("convgrad: graph.ConvGeneral built a %s node, not %s", conv.Type(), graph.NodeTypeConvGeneral)
	}
	if inputs := conv.Inputs(); len(inputs) != 2 || inputs[0] != x || inputs[1] != kernel {
		return fmt.Errorf("convgrad: ConvGeneral node inputs are not [input, kernel]")
	}
	gotConv, err := readConv(conv)
	if err != nil {
		return fmt.Errorf("convgrad: reading ConvGeneral parameters: %w", err)
	}
	if !equalConvParams(gotConv, wantConv) {
		return fmt.Errorf("convgrad: ConvGeneral built with %+v reads back as %+v", wantConv, gotConv)
	}

	wantPool := poolParams{
		reduction:        backends.ReduceOpMin,
		windowDimensions: []int{1, 3, 2, 1},
		strides:          []int{1, 2, 3, 1},
		baseDilations:    []int{1, 1, 2, 1},
		windowDilations:  []int{1, 2, 1, 1},
		paddings:         [][2]int{{0, 0}, {1, 0}, {0, 2}, {0, 0}},
	}
	operand := graph.Parameter(g, "operand", shapes.Make(dtypes.Float32, 2, 9, 8, 3))
	pool := graph.BackendReduceWindow(operand, wantPool.reduction, slices.Clone(wantPool.windowDimensions),
		slices.Clone(wantPool.strides), slices.Clone(wantPool.baseDilations), slices.Clone(wantPool.windowDilations),
		slices.Clone(wantPool.paddings))
	if pool.Type() != graph.NodeTypeReduceWindow {
		return fmt.Errorf("convgrad: graph.BackendReduceWindow built a %s node, not %s", pool.Type(), graph.NodeTypeReduceWindow)
	}
	if inputs := pool.Inputs(); len(inputs) != 1 || inputs[0] != operand {
		return fmt.Errorf("convgrad: ReduceWindow node inputs are not [operand]")
	}
	gotPool, err := readPool(pool)
	if err != nil {
		return fmt.Errorf("convgrad: reading ReduceWindow parameters: %w", err)
	}
	if !equalPoolParams(gotPool, wantPool) {
		return fmt.Errorf("convgrad: ReduceWindow built with %+v reads back as %+v", wantPool, gotPool)
	}
	return nil
}

func equalConvParams(a, b convParams) bool {
	return a.axes.InputBatch == b.axes.InputBatch && a.axes.InputChannels == b.axes.InputChannels &&
		slices.Equal(a.axes.InputSpatial, b.axes.InputSpatial) &&
		a.axes.KernelInputChannels == b.axes.KernelInputChannels &&
		a.axes.KernelOutputChannels == b.axes.KernelOutputChannels &&
		slices.Equal(a.axes.KernelSpatial, b.axes.KernelSpatial) &&
		a.axes.OutputBatch == b.axes.OutputBatch && a.axes.OutputChannels == b.axes.OutputChannels &&
		slices.Equal(a.axes.OutputSpatial, b.axes.OutputSpatial) &&
		slices.Equal(a.strides, b.strides) && slices.Equal(a.paddings, b.paddings) &&
		slices.Equal(a.inputDilations, b.inputDilations) && slices.Equal(a.kernelDilations, b.kernelDilations) &&
		a.channelGroupCount == b.channelGroupCount && a.batchGroupCount == b.batchGroupCount
}

func equalPoolParams(a, b poolParams) bool {
	return a.reduction == b.reduction && slices.Equal(a.windowDimensions, b.windowDimensions) &&
		slices.Equal(a.strides, b.strides) && slices.Equal(a.baseDilations, b.baseDilations) &&
		slices.Equal(a.windowDilations, b.windowDilations) && slices.Equal(a.paddings, b.paddings)
}
