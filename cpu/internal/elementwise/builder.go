package elementwise

import (
	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// Extend returns a backend that is inner (GoMLX's pure-Go backend, possibly already extended) except that
// a binary operation whose operand is a broadcast of a single value — graph.ZerosLike in ReLU, graph.Ones,
// a scalar expanded to a tensor's shape — takes that value as a scalar instead. simplego then loops over
// the other operand alone (its scalar path), and the broadcast is never executed: one full pass over the
// tensor and its buffer saved per occurrence, forward and backward. Results are the same.
//
// Likewise an Add, Sub, Mul, Div, Max or Min in float whose operand is a broadcast that only inserts axes
// (a LayerNorm's mean over [batch, position, 1] spread to [batch, position, width], a bias spread over a
// batch) takes the broadcast's source reshaped with axes of size 1 instead, when the installed executors
// loop over that pattern without materialising it (see Install): the broadcast is then never executed.
//
// Tensors are bound to the backend they were used with: use the returned backend throughout.
func Extend(inner backends.Backend) backends.Backend { return &scalarBackend{Backend: inner} }

// scalarBackend is a pointer type so that backends compare by identity.
type scalarBackend struct{ backends.Backend }

func (b *scalarBackend) Builder(name string) backends.Builder {
	return &scalarBuilder{Builder: b.Backend.Builder(name), singles: map[backends.Op]backends.Op{},
		expansions: map[backends.Op]expansion{}}
}

// expansion is a broadcast that only inserts axes: its source, and the source's dimensions with the
// inserted axes as 1s.
type expansion struct {
	source     backends.Op
	sourceDims []int
}

// scalarBuilder remembers, for each broadcast of a single value it built, that value as a scalar op.
type scalarBuilder struct {
	backends.Builder
	singles    map[backends.Op]backends.Op
	expansions map[backends.Op]expansion // broadcasts that only insert axes
}

func (b *scalarBuilder) BroadcastInDim(x backends.Op, outputShape shapes.Shape, broadcastAxes []int) (backends.Op, error) {
	op, err := b.Builder.BroadcastInDim(x, outputShape, broadcastAxes)
	if err == nil {
		b.remember(op, x)
		b.rememberExpansion(op, x, outputShape, broadcastAxes)
	}
	return op, err
}

// rememberExpansion records broadcast if it maps x's axes, in order, to axes of outputShape.
func (b *scalarBuilder) rememberExpansion(broadcast, x backends.Op, outputShape shapes.Shape, axes []int) {
	shape, err := b.OpShape(x)
	if err != nil || shape.Size() == 1 || len(axes) != shape.Rank() {
		return
	}
	dims := make([]int, outputShape.Rank())
	for axis := range dims {
		dims[axis] = 1
	}
	for i, axis := range axes {
		if axis < 0 || axis >= len(dims) || (i > 0 && axis <= axes[i-1]) {
			return // A transposing broadcast: not a reshape.
		}
		dims[axis] = shape.Dimensions[i]
	}
	b.expansions[broadcast] = expansion{source: x, sourceDims: dims}
}

// expanded builds op with an operand that is a remembered expansion replaced by its source reshaped, when
// the installed executors run that broadcast pattern: ok is false when it does not apply.
func (b *scalarBuilder) expanded(op func(lhs, rhs backends.Op) (backends.Op, error), lhs, rhs backends.Op) (
	result backends.Op, ok bool, err error) {
	if !Installed() {
		return nil, false, nil
	}
	lhsShape, err1 := b.OpShape(lhs)
	rhsShape, err2 := b.OpShape(rhs)
	if err1 != nil || err2 != nil || !lhsShape.Equal(rhsShape) ||
		(lhsShape.DType != dtypes.Float32 && lhsShape.DType != dtypes.Float64) {
		return nil, false, nil
	}
	for i, operand := range []backends.Op{lhs, rhs} {
		e, found := b.expansions[operand]
		if !found {
			continue
		}
		small := shapes.Make(lhsShape.DType, e.sourceDims...)
		if _, fast := planBroadcast(lhsShape, small); !fast {
			continue
		}
		reshaped, err := b.Builder.Reshape(e.source, e.sourceDims...)
		if err != nil {
			return nil, false, err
		}
		if i == 0 {
			result, err = op(reshaped, rhs)
		} else {
			result, err = op(lhs, reshaped)
		}
		return result, true, err
	}
	return nil, false, nil
}

// remember records broadcast as a broadcast of x's single value, if x has one element.
func (b *scalarBuilder) remember(broadcast, x backends.Op) {
	shape, err := b.OpShape(x)
	if err != nil || shape.Size() != 1 {
		return
	}
	scalar := x
	if shape.Rank() > 0 {
		if scalar, err = b.Builder.Reshape(x); err != nil {
			return
		}
	}
	b.singles[broadcast] = scalar
}

// binary builds op, with a broadcast single value on the right (or, when commutative, the left) replaced
// by the scalar, as long as the other operand has the broadcast's shape (so the result's shape is the same).
func (b *scalarBuilder) binary(op func(lhs, rhs backends.Op) (backends.Op, error), commutative bool,
	lhs, rhs backends.Op) (backends.Op, error) {
	if scalar, ok := b.singles[rhs]; ok && b.sameShape(lhs, rhs) {
		return op(lhs, scalar)
	}
	if scalar, ok := b.singles[lhs]; ok && commutative && b.sameShape(lhs, rhs) {
		return op(rhs, scalar)
	}
	return op(lhs, rhs)
}

func (b *scalarBuilder) sameShape(x, y backends.Op) bool {
	xShape, err1 := b.OpShape(x)
	yShape, err2 := b.OpShape(y)
	return err1 == nil && err2 == nil && xShape.Equal(yShape)
}

func (b *scalarBuilder) Add(lhs, rhs backends.Op) (backends.Op, error) {
	if result, ok, err := b.expanded(b.Builder.Add, lhs, rhs); ok {
		return result, err
	}
	return b.binary(b.Builder.Add, true, lhs, rhs)
}
func (b *scalarBuilder) Mul(lhs, rhs backends.Op) (backends.Op, error) {
	if result, ok, err := b.expanded(b.Builder.Mul, lhs, rhs); ok {
		return result, err
	}
	return b.binary(b.Builder.Mul, true, lhs, rhs)
}
func (b *scalarBuilder) Max(lhs, rhs backends.Op) (backends.Op, error) {
	if result, ok, err := b.expanded(b.Builder.Max, lhs, rhs); ok {
		return result, err
	}
	return b.binary(b.Builder.Max, true, lhs, rhs)
}
func (b *scalarBuilder) Min(lhs, rhs backends.Op) (backends.Op, error) {
	if result, ok, err := b.expanded(b.Builder.Min, lhs, rhs); ok {
		return result, err
	}
	return b.binary(b.Builder.Min, true, lhs, rhs)
}
func (b *scalarBuilder) Sub(lhs, rhs backends.Op) (backends.Op, error) {
	if result, ok, err := b.expanded(b.Builder.Sub, lhs, rhs); ok {
		return result, err
	}
	return b.binary(b.Builder.Sub, false, lhs, rhs)
}
func (b *scalarBuilder) Div(lhs, rhs backends.Op) (backends.Op, error) {
	if result, ok, err := b.expanded(b.Builder.Div, lhs, rhs); ok {
		return result, err
	}
	return b.binary(b.Builder.Div, false, lhs, rhs)
}
func (b *scalarBuilder) Pow(lhs, rhs backends.Op) (backends.Op, error) {
	return b.binary(b.Builder.Pow, false, lhs, rhs)
}
func (b *scalarBuilder) GreaterOrEqual(lhs, rhs backends.Op) (backends.Op, error) {
	return b.binary(b.Builder.GreaterOrEqual, false, lhs, rhs)
}
func (b *scalarBuilder) GreaterThan(lhs, rhs backends.Op) (backends.Op, error) {
	return b.binary(b.Builder.GreaterThan, false, lhs, rhs)
}
func (b *scalarBuilder) LessOrEqual(lhs, rhs backends.Op) (backends.Op, error) {
	return b.binary(b.Builder.LessOrEqual, false, lhs, rhs)
}
func (b *scalarBuilder) LessThan(lhs, rhs backends.Op) (backends.Op, error) {
	return b.binary(b.Builder.LessThan, false, lhs, rhs)
}
