package extraops

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

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// GoMLX v0.26.0 registers no gradient for Pad, Reverse, BatchNormForInference or BatchNormGradient (on any
// backend: the first gradient through one panics with "no gradient is defined"). These are built from ops
// this package or simplego has:
//
//   - Pad: the gradient of the operand is the incoming gradient with the edge padding undone (a Pad by
//     the negated edges: cut where it padded, zeros where it cut) and the interior padding skipped (a
//     strided Slice); the fill value's is the sum of what is left: Σ v − Σ ∂x.
//   - Reverse: the incoming gradient reversed on the same axes.
//   - BatchNormForInference: y = (x − m)·s·scale + offset with s = 1/√(v + ε) and m, v inputs, so
//     ∂x = g·s·scale, ∂scale = Σ g·(x − m)·s, ∂offset = Σ g, ∂m = −Σ g·s·scale, ∂v = −½·Σ g·(x − m)·scale·s³.
//   - BatchNormGradient (a gradient of a gradient): its three results written as GoMLX ops of copies of
//     its five inputs, differentiated by graph.Gradient.
//
// GoMLX's rule for BatchNormForTraining differentiates its normalized result only: what reaches the batch
// mean and variance, its other results, is added (see bnTrainingGradients). A ConvGeneral with channel or
// batch grouping gets the gradients of its groups, each an ungrouped ConvGeneral differentiated by the rule
// this one wraps (goaccel's convgraph rule, or GoMLX's), put back together: GoMLX's own grouped rule gives
// wrong input gradients for kernels with a dimension of even size, as its ungrouped rule does (see
// convgraph).

// Parameter struct and field names of GoMLX's graph package, read with reflect (see gomlxpatch.ParamsReader).
const (
	padInputsTypeName        = "nodeInputsPad"
	reverseInputsTypeName    = "nodeInputsReverse"
	bnInferenceInputsType    = "nodeInputsBatchNormForInference"
	bnTrainingInputsType     = "nodeInputsBatchNormForTraining"
	bnGradientInputsType     = "nodeInputsBatchNormGradient"
	convGeneralInputsType    = "nodeInputsConvGeneral"
	epsilonField             = "epsilon"
	featureAxisField         = "featureAxis"
	padAxesField, axesField  = "axesConfig", "axes"
	padStart, padEnd, padInt = "Start", "End", "Interior"
)

var patch = gomlxpatch.VJPPatch{
	Name:  "extraops",
	Check: CheckCompatible,
	VJPs: map[graph.NodeType]func(replaced graph.VJP) graph.VJP{
		graph.NodeTypePad:                   singleOutput(padGradients),
		graph.NodeTypeReverse:               singleOutput(reverseGradients),
		graph.NodeTypeBatchNormForInference: singleOutput(bnInferenceGradients),
		graph.NodeTypeBatchNormForTraining: func(replaced graph.VJP) graph.VJP {
			return func(node *graph.Node, v []*graph.Node, outputShape shapes.Shape) []*graph.Node {
				return bnTrainingGradients(node, v, outputShape, replaced)
			}
		},
		graph.NodeTypeBatchNormGradient: func(graph.VJP) graph.VJP {
			return func(node *graph.Node, v []*graph.Node, _ shapes.Shape) []*graph.Node {
				return bnGradientGradients(node, v)
			}
		},
		graph.NodeTypeConvGeneral: func(replaced graph.VJP) graph.VJP {
			return gomlxpatch.WithFallback("extraops", func(node *graph.Node, v []*graph.Node, outputShape shapes.Shape) (
				[]*graph.Node, bool) {
				return groupedConvGradients(node, v, outputShape, replaced)
			}, replaced)
		},
	},
}

// RegisterGradients installs the gradients into graph.VJPRegistration. It is idempotent, and must not run
// while graphs are being differentiated. Its ConvGeneral rule wraps the one registered before it: register
// after any other patch of ConvGeneral's rule (convgraph's), and unregister before changing that one.
// It panics when CheckCompatible fails.
func RegisterGradients() { patch.Register() }

// UnregisterGradients restores what RegisterGradients replaced.
func UnregisterGradients() { patch.Unregister() }

// GradientsRegistered reports whether the gradients are registered.
func GradientsRegistered() bool { return patch.Registered() }

// singleOutput adapts the gradients of a single-output node to graph.VJP.
func singleOutput(gradients func(node, v *graph.Node) []*graph.Node) func(graph.VJP) graph.VJP {
	return func(graph.VJP) graph.VJP {
		return func(node *graph.Node, v []*graph.Node, _ shapes.Shape) []*graph.Node {
			return gradients(node, v[0])
		}
	}
}

// incompatible is the panic of a gradient that cannot read its node's parameters.
func incompatible(node *graph.Node, err error) string {
	return fmt.Sprintf("extraops: reading the parameters of %s node %s: %v (GoMLX internals changed? written "+
		"against GoMLX v0.26.0)", node.Type(), node, err)
}

// readPadConfig reads a Pad node's per-axis configuration.
func readPadConfig(node *graph.Node) ([]backends.PadAxis, error) {
	r, err := gomlxpatch.NewParamsReader(node, padInputsTypeName)
	if err != nil {
		return nil, err
	}
	value, ok := r.Field(padAxesField, reflect.Slice)
	if !ok {
		return nil, r.Err
	}
	if value.Type().Elem() != reflect.TypeFor[backends.PadAxis]() {
		return nil, fmt.Errorf("%s.%s is a %s, not a []backends.PadAxis", r.Params.Type(), padAxesField, value.Type())
	}
	config := make([]backends.PadAxis, value.Len())
	for i := range config {
		axis := value.Index(i)
		config[i] = backends.PadAxis{Start: int(axis.FieldByName(padStart).Int()),
			End: int(axis.FieldByName(padEnd).Int()), Interior: int(axis.FieldByName(padInt).Int())}
	}
	return config, nil
}

// padGradients are Pad's gradients with respect to its operand and its fill value.
func padGradients(node, v *graph.Node) []*graph.Node {
	x := node.Inputs()[0]
	config, err := readPadConfig(node)
	if err != nil {
		panic(incompatible(node, err))
	}
	g := node.Graph()
	gradX := v
	unpad := make([]backends.PadAxis, x.Rank())
	spaced := false
	for a, c := range config {
		unpad[a] = backends.PadAxis{Start: -c.Start, End: -c.End}
		// Spacing matters between elements: not on axes of 0 or 1 (simplego slices no empty axis).
		spaced = spaced || (c.Interior > 0 && x.Shape().Dimensions[a] > 1)
	}
	if slices.ContainsFunc(unpad, func(c backends.PadAxis) bool { return c != backends.PadAxis{} }) {
		gradX = graph.Pad(gradX, graph.ScalarZero(g, v.DType()), unpad...)
	}
	if spaced {
		ranges := make([]graph.SliceAxisSpec, x.Rank())
		for a := range ranges {
			ranges[a] = graph.AxisRange()
			if a < len(config) && config[a].Interior > 0 && x.Shape().Dimensions[a] > 1 {
				ranges[a] = graph.AxisRange().Stride(config[a].Interior + 1)
			}
		}
		gradX = graph.Slice(gradX, ranges...)
	}
	gradFill := graph.Sub(graph.ReduceAllSum(v), graph.ReduceAllSum(gradX))
	return []*graph.Node{gradX, gradFill}
}

// reverseGradients is Reverse's gradient: the incoming gradient reversed the same way.
func reverseGradients(node, v *graph.Node) []*graph.Node {
	r, err := gomlxpatch.NewParamsReader(node, reverseInputsTypeName)
	if err != nil {
		panic(incompatible(node, err))
	}
	axes := r.Ints(axesField)
	if r.Err != nil {
		panic(incompatible(node, r.Err))
	}
	return []*graph.Node{graph.Reverse(v, axes...)}
}

// readBNParams reads a batch normalization node's epsilon and feature axis.
func readBNParams(node *graph.Node, typeName string) (epsilon float64, featureAxis int, err error) {
	r, err := gomlxpatch.NewParamsReader(node, typeName)
	if err != nil {
		return 0, 0, err
	}
	if value, ok := r.Field(epsilonField, reflect.Float32); ok {
		epsilon = value.Float()
	}
	featureAxis = r.Int(featureAxisField)
	return epsilon, featureAxis, r.Err
}

// bnShapes helps write batch normalizations as GoMLX ops: the axes summed over, and per-feature vectors
// shaped to broadcast against the operand.
type bnShapes struct {
	others []int // every axis but the feature axis
	dims   []int // 1s, and the features on the feature axis
}

func newBNShapes(x *graph.Node, featureAxis int) bnShapes {
	s := bnShapes{dims: ones(x.Rank())}
	s.dims[featureAxis] = x.Shape().Dimensions[featureAxis]
	for a := range x.Rank() {
		if a != featureAxis {
			s.others = append(s.others, a)
		}
	}
	return s
}

// sum sums t over every axis but the feature axis (graph.ReduceSum with no axes would sum them all).
func (s bnShapes) sum(t *graph.Node) *graph.Node {
	if len(s.others) == 0 {
		return t
	}
	return graph.ReduceSum(t, s.others...)
}

// invSqrt is 1/√(variance + ε), written with ops GoMLX can differentiate (it has no gradient for Rsqrt).
func invSqrt(variance *graph.Node, epsilon float64) *graph.Node {
	return graph.Div(graph.OnesLike(variance), graph.Sqrt(graph.AddScalar(variance, epsilon)))
}

func (s bnShapes) expand(perFeature *graph.Node) *graph.Node {
	return graph.Reshape(perFeature, s.dims...)
}

// bnInferenceGradients are BatchNormForInference's gradients with respect to operand, scale, offset, mean
// and variance.
func bnInferenceGradients(node, v *graph.Node) []*graph.Node {
	epsilon, featureAxis, err := readBNParams(node, bnInferenceInputsType)
	if err != nil {
		panic(incompatible(node, err))
	}
	inputs := node.Inputs()
	x, scale, mean, variance := inputs[0], inputs[1], inputs[3], inputs[4]
	s := newBNShapes(x, featureAxis)
	inv := invSqrt(variance, epsilon)
	scaled := graph.Mul(scale, inv)
	sumV := s.sum(v)
	sumVC := s.sum(graph.Mul(v, graph.Sub(x, s.expand(mean))))
	return []*graph.Node{
		graph.Mul(v, s.expand(scaled)),
		graph.Mul(sumVC, inv),
		sumV,
		graph.Neg(graph.Mul(sumV, scaled)),
		graph.Mul(sumVC, graph.MulScalar(graph.Mul(scaled, graph.Square(inv)), -0.5)),
	}
}

// bnTrainingGradients are BatchNormForTraining's gradients with respect to operand, scale and offset: GoMLX's
// rule (replaced), which differentiates the normalized result alone, plus what reaches the batch mean m and
// variance v, results of their own: ∂x += ∂m/N + 2·(x − m)·∂v/N (they depend on x alone). Those are zeros
// in a plain training step; a gradient of a gradient (the BatchNormGradient GoMLX's rule builds reads m
// and v) is where they are not.
func bnTrainingGradients(node *graph.Node, v []*graph.Node, outputShape shapes.Shape, replaced graph.VJP) []*graph.Node {
	if replaced == nil {
		panic(fmt.Sprintf("extraops: no gradient was registered for %s node %s", node.Type(), node))
	}
	grads := replaced(node, v, outputShape)
	if len(v) != 3 || len(grads) != 3 || grads[0] == nil || (v[1] == nil && v[2] == nil) {
		return grads
	}
	_, featureAxis, err := readBNParams(node, bnTrainingInputsType)
	if err != nil {
		panic(incompatible(node, err))
	}
	x := node.Inputs()[0]
	s := newBNShapes(x, featureAxis)
	n := float64(x.Shape().Size() / max(x.Shape().Dimensions[featureAxis], 1))
	// The batch mean as GoMLX's rule read it: an input of the BatchNormGradient behind its first result.
	var mean *graph.Node
	if split := grads[0]; split.Type() == graph.NodeTypeSplitNode && len(split.Inputs()) == 1 {
		if gradient := split.Inputs()[0]; gradient.Type() == graph.NodeTypeBatchNormGradient && len(gradient.Inputs()) == 5 {
			mean = gradient.Inputs()[2]
		}
	}
	if mean == nil {
		mean = s.sum(graph.DivScalar(x, n))
	}
	gradX := grads[0]
	if v[1] != nil {
		gradX = graph.Add(gradX, s.expand(graph.DivScalar(v[1], n)))
	}
	if v[2] != nil {
		gradX = graph.Add(gradX, graph.Mul(graph.Sub(x, s.expand(mean)), s.expand(graph.MulScalar(v[2], 2/n))))
	}
	return []*graph.Node{gradX, grads[1], grads[2]}
}

// bnGradientGradients are BatchNormGradient's gradients with respect to operand, scale, mean, variance and
// gradOutput, given those of its three results (zeros where unused, as GoMLX passes them).
func bnGradientGradients(node *graph.Node, v []*graph.Node) []*graph.Node {
	epsilon, featureAxis, err := readBNParams(node, bnGradientInputsType)
	if err != nil {
		panic(incompatible(node, err))
	}
	// Copies of the inputs, so that the gradient is with respect to each alone: the mean and variance are
	// usually computed from the operand, a path that is not BatchNormGradient's to differentiate.
	inputs := make([]*graph.Node, len(node.Inputs()))
	for i, input := range node.Inputs() {
		inputs[i] = graph.Identity(input)
	}
	x, scale, mean, variance, g := inputs[0], inputs[1], inputs[2], inputs[3], inputs[4]
	s := newBNShapes(x, featureAxis)
	n := float64(x.Shape().Size() / max(x.Shape().Dimensions[featureAxis], 1))
	inv := invSqrt(variance, epsilon)
	centered := graph.Sub(x, s.expand(mean))
	gradOffset := s.sum(g)
	gradScale := graph.Mul(s.sum(graph.Mul(g, centered)), inv)
	gradX := graph.Mul(s.expand(graph.DivScalar(graph.Mul(scale, inv), n)),
		graph.Sub(graph.Sub(graph.MulScalar(g, n), s.expand(gradOffset)),
			graph.Mul(centered, s.expand(graph.Mul(inv, gradScale)))))
	var total *graph.Node
	for i, result := range []*graph.Node{gradX, gradScale, gradOffset} {
		if i >= len(v) || v[i] == nil {
			continue
		}
		term := graph.ReduceAllSum(graph.Mul(v[i], result))
		if total == nil {
			total = term
		} else {
			total = graph.Add(total, term)
		}
	}
	if total == nil {
		return make([]*graph.Node, len(inputs))
	}
	return graph.Gradient(total, inputs...)
}

// convParams are a ConvGeneral node's parameters.
type convParams struct {
	axes                                     backends.ConvolveAxesConfig
	strides, inputDilations, kernelDilations []int
	paddings                                 [][2]int
	channelGroupCount, batchGroupCount       int
}

func readConvParams(node *graph.Node) (convParams, error) {
	r, err := gomlxpatch.NewParamsReader(node, convGeneralInputsType)
	if err != nil {
		return convParams{}, err
	}
	var p convParams
	r.Struct("axes", reflect.TypeFor[backends.ConvolveAxesConfig](), func(f *gomlxpatch.ParamsReader) {
		p.axes = backends.ConvolveAxesConfig{
			InputBatch: f.Int("InputBatch"), InputChannels: f.Int("InputChannels"), InputSpatial: f.Ints("InputSpatial"),
			KernelInputChannels: f.Int("KernelInputChannels"), KernelOutputChannels: f.Int("KernelOutputChannels"),
			KernelSpatial: f.Ints("KernelSpatial"), OutputBatch: f.Int("OutputBatch"),
			OutputChannels: f.Int("OutputChannels"), OutputSpatial: f.Ints("OutputSpatial"),
		}
	})
	p.strides, p.paddings = r.Ints("strides"), r.Pairs("paddings")
	p.inputDilations, p.kernelDilations = r.Ints("inputDilations"), r.Ints("kernelDilations")
	p.channelGroupCount, p.batchGroupCount = r.Int("channelGroupCount"), r.Int("batchGroupCount")
	return p, r.Err
}

// groupedConvGradients are the gradients of a grouped ConvGeneral, or false for an ungrouped one (left to
// ungrouped, the rule this one wraps).
func groupedConvGradients(node *graph.Node, v []*graph.Node, outputShape shapes.Shape, ungrouped graph.VJP) (
	[]*graph.Node, bool) {
	inputs := node.Inputs()
	if len(inputs) != 2 || ungrouped == nil {
		return nil, false
	}
	p, err := readConvParams(node)
	if err != nil {
		panic(incompatible(node, err))
	}
	if p.channelGroupCount <= 1 && p.batchGroupCount <= 1 {
		return nil, false
	}
	x, kernel := inputs[0], inputs[1]
	groups, inputAxis := p.channelGroupCount, p.axes.InputChannels
	if p.batchGroupCount > 1 {
		groups, inputAxis = p.batchGroupCount, p.axes.InputBatch
	}
	xParts := graph.Split(x, inputAxis, groups)
	kernelParts := graph.Split(kernel, p.axes.KernelOutputChannels, groups)
	vParts := graph.Split(v[0], p.axes.OutputChannels, groups)
	xGrads, kernelGrads := make([]*graph.Node, groups), make([]*graph.Node, groups)
	for i := range groups {
		// The group's own convolution: never run (nothing reads it), it carries the group's shapes and
		// parameters to the ungrouped rule.
		group := graph.ConvGeneral(xParts[i], kernelParts[i], p.axes.Clone(), p.strides, p.paddings,
			p.inputDilations, p.kernelDilations, 1, 1)
		grads := ungrouped(group, []*graph.Node{vParts[i]}, outputShape)
		xGrads[i], kernelGrads[i] = orZeros(grads[0], xParts[i]), orZeros(grads[1], kernelParts[i])
	}
	return []*graph.Node{graph.Concatenate(xGrads, inputAxis), graph.Concatenate(kernelGrads,
		p.axes.KernelOutputChannels)}, true
}

func orZeros(grad, like *graph.Node) *graph.Node {
	if grad == nil {
		return graph.ZerosLike(like)
	}
	return grad
}

// CheckCompatible reports whether the GoMLX in use stores the parameters of Pad, Reverse, the batch
// normalizations and ConvGeneral where the gradients read them: it builds each (without running it) with
// distinctive parameters and reads them back. The result is computed once per process; RegisterGradients
// panics with it.
func CheckCompatible() error { return compatibility() }

var compatibility = sync.OnceValue(func() error {
	inner, err := simplego.New("")
	if err != nil {
		return fmt.Errorf("extraops: creating the pure-Go backend to probe node parameters: %w", err)
	}
	defer inner.Finalize()
	return probe(&extendedBackend{Backend: inner, probe: true})
})

// probe builds the nodes whose parameters the gradients read on backend, and reads them back.
func probe(backend backends.Backend) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("extraops: building the compatibility probe: %v", r)
		}
	}()
	g := graph.NewGraph(backend, "extraops_compatibility_probe")
	defer g.Finalize()
	x := graph.Parameter(g, "x", shapes.Make(dtypes.Float32, 2, 3, 4))
	features := graph.Parameter(g, "features", shapes.Make(dtypes.Float32, 3))
	wantPad := []backends.PadAxis{{Start: 1, End: -1, Interior: 2}, {Start: 3, End: 4, Interior: 0}}
	if got, err := readPadConfig(graph.Pad(x, graph.ScalarZero(g, dtypes.Float32), wantPad...)); err != nil ||
		!slices.Equal(got, wantPad) {
		return fmt.Errorf("extraops: Pad built with %v reads back as %v (%v)", wantPad, got, err)
	}
	reverse := graph.Reverse(x, 2, 0)
	r, err := gomlxpatch.NewParamsReader(reverse, reverseInputsTypeName)
	if err != nil {
		return fmt.Errorf("extraops: reading Reverse: %w", err)
	}
	if got := r.Ints(axesField); r.Err != nil || !slices.Equal(got, []int{2, 0}) {
		return fmt.Errorf("extraops: Reverse built with axes [2 0] reads back as %v (%v)", got, r.Err)
	}
	inference := graph.InternalBatchNormForInference(x, features, features, features, features, 0.25, 1)
	if epsilon, axis, err := readBNParams(inference, bnInferenceInputsType); err != nil || epsilon != 0.25 || axis != 1 {
		return fmt.Errorf("extraops: BatchNormForInference built with epsilon 0.25, axis 1 reads back as %g, %d (%v)",
			epsilon, axis, err)
	}
	training, _, _ := graph.InternalBatchNormForTraining(x, features, features, 0.125, 1)
	if epsilon, axis, err := readBNParams(training.Inputs()[0], bnTrainingInputsType); err != nil || epsilon != 0.125 || axis != 1 {
		return fmt.Errorf("extraops: BatchNormForTraining built with epsilon 0.125, axis 1 reads back as %g, %d (%v)",
			epsilon, axis, err)
	}
	gradOperand, _, _ := graph.InternalBatchNormGradient(x, features, features, features, x, 0.5, 1)
	gradient := gradOperand.Inputs()[0] // The BatchNormGradient node behind its first result.
	if epsilon, axis, err := readBNParams(gradient, bnGradientInputsType); err != nil || epsilon != 0.5 || axis != 1 {
		return fmt.Errorf("extraops: BatchNormGradient built with epsilon 0.5, axis 1 reads back as %g, %d (%v)",
			epsilon, axis, err)
	}
	image := graph.Parameter(g, "image", shapes.Make(dtypes.Float32, 2, 5, 5, 4))
	kernel := graph.Parameter(g, "kernel", shapes.Make(dtypes.Float32, 3, 2, 2, 6))
	conv := graph.Convolve(image, kernel).StridePerAxis(2, 1).PaddingPerDim([][2]int{{1, 0}, {0, 2}}).
		ChannelGroupCount(2).Done()
	p, err := readConvParams(conv)
	if err != nil || p.channelGroupCount != 2 || p.batchGroupCount != 1 || !slices.Equal(p.strides, []int{2, 1}) ||
		!slices.Equal(p.paddings, [][2]int{{1, 0}, {0, 2}}) || p.axes.InputChannels != 3 ||
		p.axes.KernelOutputChannels != 3 || !slices.Equal(p.axes.KernelSpatial, []int{0, 1}) {
		return fmt.Errorf("extraops: a grouped ConvGeneral reads back as %+v (%v)", p, err)
	}
	return nil
}
