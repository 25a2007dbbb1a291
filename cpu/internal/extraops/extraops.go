// Package extraops gives GoMLX's pure-Go backend (simplego, GoMLX v0.26.0) the operations it lacks and
// that GoMLX's layers and gradients build, so that those models train there:
//
//   - Pad (edge padding, negative edge padding that crops, interior padding, as XLA defines them): the
//     gradient of every Slice (GoMLX's Slice VJP pads the incoming gradient), hence of LSTMs, Split and
//     attention masks built by slicing;
//   - Reverse: GoMLX's gradient of a convolution, with its own rules (GOACCEL_GRADIENTS=gomlx);
//   - DynamicSlice and DynamicUpdateSlice, start indices clamped as XLA clamps them;
//   - BatchNormForTraining, BatchNormForInference and BatchNormGradient: batchnorm.New's default path
//     (UseBackendInference) and the gradient GoMLX builds for it.
//
// Each is a node of its own op type created in simplego's graph (gomlxpatch.NewNode) by the builder
// Extend returns, and run by an executor Install puts in simplego's table: plain Go loops, a pass or two
// over the data (the data-moving ops for any dtype, the batch normalizations in float32 and float64).
//
// The builder also works around what simplego gets wrong in convolutions and pooling that layers build:
//
//   - a ConvGeneral without strides (graph.Convolve without Strides) fails simplego's shape inference,
//     which reads nil strides as 0: the builder passes 1s;
//   - a ConvGeneral with channel or batch grouping (graph.Convolve(...).ChannelGroupCount(g), depthwise
//     convolutions) panics in simplego's executor (it indexes nil kernel dilations): the builder builds it
//     as one ungrouped convolution per group, which run on the installed convolution kernel, concatenated;
//   - a ReduceWindow of booleans (layers.DropBlock's MinPool of its mask) panics in simplego, which has
//     no boolean reductions: the builder converts to uint8, reduces and converts back.
//
// GoMLX v0.26.0 registers no gradient for Pad, Reverse, BatchNormForInference or BatchNormGradient, on any
// backend: RegisterGradients adds them, completes GoMLX's gradient of BatchNormForTraining, and gives
// grouped convolutions a gradient built from those of their ungrouped groups (see gradients.go).
package extraops

import (
	"errors"
	"fmt"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// Extend returns a backend that is inner (GoMLX's pure-Go backend, possibly already extended by goaccel's
// other wrappers) plus the operations this package adds, listed in its Capabilities. The operations'
// nodes run only once Install has run.
//
// Tensors are bound to the backend they were used with: use the returned backend throughout.
func Extend(inner backends.Backend) backends.Backend { return &extendedBackend{Backend: inner} }

// extendedBackend is a pointer type so that backends compare by identity.
type extendedBackend struct {
	backends.Backend
	// probe lets the builder create nodes without Install, for CheckCompatible's graphs (never run).
	probe bool
}

// addedOps are the operations this package adds to simplego.
var addedOps = []backends.OpType{
	backends.OpTypePad, backends.OpTypeReverse, backends.OpTypeDynamicSlice, backends.OpTypeDynamicUpdateSlice,
	backends.OpTypeBatchNormForInference, backends.OpTypeBatchNormForTraining, backends.OpTypeBatchNormGradient,
}

// Builder returns inner's builder with the added operations.
func (b *extendedBackend) Builder(name string) backends.Builder {
	inner := b.Backend.Builder(name)
	graph, err := simplegoBuilder(inner)
	return &extendedBuilder{Builder: inner, graph: graph, graphErr: err, probe: b.probe}
}

// Capabilities are inner's, plus the added operations.
func (b *extendedBackend) Capabilities() backends.Capabilities {
	capabilities := b.Backend.Capabilities().Clone()
	for _, op := range addedOps {
		capabilities.Operations[op] = true
	}
	return capabilities
}

// extendedBuilder adds operations to a builder; graph is the simplego builder at the bottom of the stack of
// wrappers, where the nodes of the added operations are created.
type extendedBuilder struct {
	backends.Builder
	graph    *simplego.Builder
	graphErr error
	probe    bool
}

// simplegoBuilder finds the simplego builder under goaccel's builder wrappers, each of which embeds the
// builder it wraps as its (exported, embedded) field Builder. Nodes of added ops must be created in it:
// wrappers further in (convkernel's) create their own nodes there, and a builder that is not simplego's
// cannot hold them.
func simplegoBuilder(builder backends.Builder) (*simplego.Builder, error) {
	if b, ok := gomlxpatch.Unwrap[*simplego.Builder](builder, "Builder"); ok {
		return b, nil
	}
	return nil, fmt.Errorf("extraops: builder %T is not the pure-Go backend's, nor a wrapper of it", builder)
}

// errNotInstalled is what the added operations report when built without Install.
var errNotInstalled = errors.New("extraops: the operation needs extraops.Install (cpu.New installs it)")

// newNode creates a node of an added op in the simplego graph.
func (b *extendedBuilder) newNode(opType backends.OpType, shape shapes.Shape, data any, inputs ...backends.Op) (
	backends.Op, error) {
	if b.graphErr != nil {
		return nil, fmt.Errorf("%s: %w", opType, b.graphErr)
	}
	if !b.probe && !Installed() {
		return nil, fmt.Errorf("%s: %w", opType, errNotInstalled)
	}
	return gomlxpatch.NewNode(b.graph, opType, shape, data, inputs...)
}

// shapesOf returns the shapes of ops.
func (b *extendedBuilder) shapesOf(opType backends.OpType, ops ...backends.Op) ([]shapes.Shape, error) {
	result := make([]shapes.Shape, len(ops))
	for i, op := range ops {
		shape, err := b.OpShape(op)
		if err != nil {
			return nil, fmt.Errorf("%s: input #%d: %w", opType, i, err)
		}
		result[i] = shape
	}
	return result, nil
}

// isFloat reports whether the executors compute dtype's batch normalizations.
func isFloat(dtype dtypes.DType) bool { return dtype == dtypes.Float32 || dtype == dtypes.Float64 }
