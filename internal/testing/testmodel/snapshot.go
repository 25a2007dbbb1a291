package testmodel

import (
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
)

// Snapshot is float32 variable values by scope-and-name, JSON-encodable so MPI ranks can report them.
type Snapshot map[string]SnapshotValue

// SnapshotValue is one variable's dimensions and values.
type SnapshotValue struct {
	Dims   []int     `json:"dims"`
	Values []float32 `json:"values"`
}

// TakeSnapshot copies the float32 variables among vars.
func TakeSnapshot(vars []*context.Variable) (Snapshot, error) {
	s := Snapshot{}
	for _, v := range vars {
		value, err := v.Value()
		if err != nil {
			return nil, err
		}
		flat, err := tensors.CopyFlatData[float32](value)
		if err != nil {
			return nil, err
		}
		s[v.ScopeAndName()] = SnapshotValue{Dims: value.Shape().Dimensions, Values: flat}
	}
	return s, nil
}

// Context returns a new context holding the snapshot's variables.
func (s Snapshot) Context() *context.Context {
	ctx := context.New()
	for name, v := range s {
		scope, base := context.SplitScope(name)
		ctx.InAbsPath(scope).Checked(false).VariableWithValue(base,
			tensors.FromFlatDataAndDimensions(append([]float32(nil), v.Values...), v.Dims...))
	}
	return ctx
}
