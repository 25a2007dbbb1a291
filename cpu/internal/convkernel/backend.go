package convkernel

import (
	"fmt"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/shapeinference"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// Extend returns a backend that is inner (GoMLX's pure-Go backend) plus the ops of pooling gradients it
// lacks, SelectAndScatterMax and SelectAndScatterMin, built as nodes that Install's executors run. Its
// Capabilities list them, so gradient rules can tell that GoMLX's own max-pooling gradient runs here.
//
// Tensors are bound to the backend they were used with: use the returned backend, not inner, throughout.
func Extend(inner backends.Backend) backends.Backend { return &extendedBackend{Backend: inner} }

// extendedBackend is a pointer type so that backends compare (tensors check which backend holds them) by
// identity.
type extendedBackend struct{ backends.Backend }

// Builder returns inner's builder with SelectAndScatterMax and SelectAndScatterMin.
func (b *extendedBackend) Builder(name string) backends.Builder {
	return &extendedBuilder{Builder: b.Backend.Builder(name)}
}

// Capabilities are inner's, plus SelectAndScatterMax and SelectAndScatterMin.
func (b *extendedBackend) Capabilities() backends.Capabilities {
	capabilities := b.Backend.Capabilities().Clone()
	capabilities.Operations[backends.OpTypeSelectAndScatterMax] = true
	capabilities.Operations[backends.OpTypeSelectAndScatterMin] = true
	return capabilities
}

// Extends reports whether backend is one Extend returned (or wraps one that does not hide it).
func Extends(backend backends.Backend) bool {
	_, ok := backend.(*extendedBackend)
	return ok
}

type extendedBuilder struct{ backends.Builder }

// SelectAndScatterMax implements backends.Builder.
func (b *extendedBuilder) SelectAndScatterMax(operand, source backends.Op, windowDimensions, windowStrides []int,
	paddings [][2]int) (backends.Op, error) {
	return b.selectAndScatter(true, operand, source, windowDimensions, windowStrides, paddings)
}

// SelectAndScatterMin implements backends.Builder.
func (b *extendedBuilder) SelectAndScatterMin(operand, source backends.Op, windowDimensions, windowStrides []int,
	paddings [][2]int) (backends.Op, error) {
	return b.selectAndScatter(false, operand, source, windowDimensions, windowStrides, paddings)
}

func (b *extendedBuilder) selectAndScatter(selectMax bool, operand, source backends.Op, windowDimensions,
	windowStrides []int, paddings [][2]int) (backends.Op, error) {
	opType := backends.OpTypeSelectAndScatterMin
	if selectMax {
		opType = backends.OpTypeSelectAndScatterMax
	}
	if !Installed() {
		return nil, fmt.Errorf("%s: %w", opType, errNotInstalled)
	}
	operandShape, err := b.OpShape(operand)
	if err != nil {
		return nil, err
	}
	sourceShape, err := b.OpShape(source)
	if err != nil {
		return nil, err
	}
	pooled, err := shapeinference.ReduceWindowOp(operandShape, windowDimensions, windowStrides, nil, nil, paddings)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", opType, err)
	}
	if !pooled.Equal(sourceShape) {
		return nil, fmt.Errorf("%s: source %s is not the pooled shape %s of operand %s", opType, sourceShape,
			pooled, operandShape)
	}
	params := &selectAndScatterParams{selectMax: selectMax, windowDimensions: windowDimensions,
		strides: windowStrides, paddings: paddings}
	return gomlxpatch.NewNode(b.Builder, opType, operandShape, params, operand, source)
}
