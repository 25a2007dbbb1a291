package convgraph

import (
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// GoMLX (v0.26.0) keeps a ConvGeneral's and a ReduceWindow's parameters in its node parameters (see
// gomlxpatch) of types nodeInputsConvGeneral and nodeInputsReduceWindow, with the fields below. These names
// and kinds are everything this package relies on beyond GoMLX's public API, and CheckCompatible verifies
// them.
const (
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

// readConvParams reads the parameters of a ConvGeneral node from GoMLX's unexported node inputs.
func readConvParams(node *graph.Node) (convParams, error) {
	r, err := gomlxpatch.NewParamsReader(node, convGeneralInputsTypeName)
	if err != nil {
		return convParams{}, err
	}
	p := convParams{
		axes:              readConvolveAxes(r, convAxesField),
		strides:           r.Ints(convStridesField),
		paddings:          r.Pairs(convPaddingsField),
		inputDilations:    r.Ints(convInputDilationsField),
		kernelDilations:   r.Ints(convKernelDilationsField),
		channelGroupCount: r.Int(convChannelGroupField),
		batchGroupCount:   r.Int(convBatchGroupField),
	}
	return p, r.Err
}

// readPoolParams reads the parameters of a ReduceWindow node from GoMLX's unexported node inputs.
func readPoolParams(node *graph.Node) (poolParams, error) {
	r, err := gomlxpatch.NewParamsReader(node, reduceWindowInputsTypeName)
	if err != nil {
		return poolParams{}, err
	}
	p := poolParams{
		reduction:        backends.ReduceOpType(r.TypedInt(poolReductionTypeField, reflect.TypeFor[backends.ReduceOpType]())),
		windowDimensions: r.Ints(poolWindowDimensionsField),
		strides:          r.Ints(poolStridesField),
		baseDilations:    r.Ints(poolBaseDilationsField),
		windowDilations:  r.Ints(poolWindowDilationsField),
		paddings:         r.Pairs(poolPaddingsField),
	}
	return p, r.Err
}

// readConvolveAxes reads a backends.ConvolveAxesConfig field, one exported field at a time since the value
// as a whole cannot be taken out of an unexported field.
func readConvolveAxes(r *gomlxpatch.ParamsReader, name string) (axes backends.ConvolveAxesConfig) {
	r.Struct(name, reflect.TypeFor[backends.ConvolveAxesConfig](), func(fields *gomlxpatch.ParamsReader) {
		axes = backends.ConvolveAxesConfig{
			InputBatch:           fields.Int("InputBatch"),
			InputChannels:        fields.Int("InputChannels"),
			InputSpatial:         fields.Ints("InputSpatial"),
			KernelInputChannels:  fields.Int("KernelInputChannels"),
			KernelOutputChannels: fields.Int("KernelOutputChannels"),
			KernelSpatial:        fields.Ints("KernelSpatial"),
			OutputBatch:          fields.Int("OutputBatch"),
			OutputChannels:       fields.Int("OutputChannels"),
			OutputSpatial:        fields.Ints("OutputSpatial"),
		}
	})
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
	readPool func(*graph.Node) (poolParams, error)) error {
	return gomlxpatch.Probe("convgraph", "node parameters", func(g *graph.Graph) error {
		return probeNodes(g, readConv, readPool)
	})
}

// probeNodes builds a ConvGeneral and a ReduceWindow in g and checks that readConv and readPool read their
// parameters back.
func probeNodes(g *graph.Graph, readConv func(*graph.Node) (convParams, error),
	readPool func(*graph.Node) (poolParams, error)) error {
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
		return fmt.Errorf("convgraph: graph.ConvGeneral built a %s node, not %s", conv.Type(), graph.NodeTypeConvGeneral)
	}
	if inputs := conv.Inputs(); len(inputs) != 2 || inputs[0] != x || inputs[1] != kernel {
		return fmt.Errorf("convgraph: ConvGeneral node inputs are not [input, kernel]")
	}
	gotConv, err := readConv(conv)
	if err != nil {
		return fmt.Errorf("convgraph: reading ConvGeneral parameters: %w", err)
	}
	if !equalConvParams(gotConv, wantConv) {
		return fmt.Errorf("convgraph: ConvGeneral built with %+v reads back as %+v", wantConv, gotConv)
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
		return fmt.Errorf("convgraph: graph.BackendReduceWindow built a %s node, not %s", pool.Type(), graph.NodeTypeReduceWindow)
	}
	if inputs := pool.Inputs(); len(inputs) != 1 || inputs[0] != operand {
		return fmt.Errorf("convgraph: ReduceWindow node inputs are not [operand]")
	}
	gotPool, err := readPool(pool)
	if err != nil {
		return fmt.Errorf("convgraph: reading ReduceWindow parameters: %w", err)
	}
	if !equalPoolParams(gotPool, wantPool) {
		return fmt.Errorf("convgraph: ReduceWindow built with %+v reads back as %+v", wantPool, gotPool)
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

// ConvParams are a ConvGeneral node's parameters, read from the graph (what the memory estimate asks the
// convolution executors about).
type ConvParams struct {
	Axes                               backends.ConvolveAxesConfig
	Strides                            []int
	Paddings                           [][2]int
	InputDilations, KernelDilations    []int
	ChannelGroupCount, BatchGroupCount int
}

// ReadConvParams reads a ConvGeneral node's parameters from GoMLX's unexported node inputs.
func ReadConvParams(node *graph.Node) (ConvParams, error) {
	p, err := readConvParams(node)
	return ConvParams{Axes: p.axes, Strides: p.strides, Paddings: p.paddings, InputDilations: p.inputDilations,
		KernelDilations: p.kernelDilations, ChannelGroupCount: p.channelGroupCount,
		BatchGroupCount: p.batchGroupCount}, err
}
