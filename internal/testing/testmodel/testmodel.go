// Package testmodel holds the small model, synthetic data and reference trainer that goaccel's tests and
// benchmarks share: one definition, so the in-process, MPI and single-process runs train the same thing.
package testmodel

import (
	"fmt"
	"math"
	"math/rand/v2"

	gomlxbackends "github.com/gomlx/gomlx/backends"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/prepare"
)

// Features, Hidden and Classes size the test MLP: small, because GoMLX's pure-Go backend is slow at dense
// gradients, but with two layers so that buckets hold several parameters.
const (
	Features = 6
	Hidden   = 8
	Classes  = 3
)

// MLP is a two-layer classifier.
func MLP(ctx *context.Context, inputs []*Node) []*Node {
	h := Tanh(layers.Dense(ctx.In("hidden"), inputs[0], true, Hidden))
	return []*Node{layers.Dense(ctx.In("output"), h, true, Classes)}
}

// Loss is the mean sparse cross-entropy on logits.
func Loss(labels, predictions []*Node) *Node {
	return losses.SparseCategoricalCrossEntropyLogits(labels, predictions)
}

// Data returns n deterministic examples: float32 inputs [n, Features] and int32 labels [n, 1] that depend
// on the inputs (so training makes progress).
func Data(n int, seed uint64) (inputs, labels *tensors.Tensor) {
	rng := rand.New(rand.NewPCG(seed, 7))
	x := make([]float32, n*Features)
	y := make([]int32, n)
	for i := range n {
		var s float32
		for f := range Features {
			v := float32(rng.NormFloat64())
			x[i*Features+f] = v
			s += v * float32(f-2)
		}
		switch {
		case s > 1:
			y[i] = 2
		case s < -1:
			y[i] = 0
		default:
			y[i] = 1
		}
	}
	return tensors.FromFlatDataAndDimensions(x, n, Features), tensors.FromFlatDataAndDimensions(y, n, 1)
}

// Rows returns rows [from, to) of t as a new tensor.
func Rows(t *tensors.Tensor, from, to int) *tensors.Tensor {
	src, err := prepare.TensorSource([]*tensors.Tensor{t}, nil)
	if err != nil {
		panic(err)
	}
	indices := make([]int, to-from)
	for i := range indices {
		indices[i] = from + i
	}
	rows, _, err := src.Batch(indices)
	if err != nil {
		panic(err)
	}
	return rows[0]
}

// OptimizerKind names a GoMLX optimizer the tests use.
type OptimizerKind string

// Optimizers the tests cover.
const (
	SGD  OptimizerKind = "sgd"
	Adam OptimizerKind = "adam"
)

// NewOptimizer returns a fresh optimizer of the kind, with a fixed learning rate (no decay), so that runs
// are comparable step by step.
func NewOptimizer(kind OptimizerKind) optimizers.Interface {
	switch kind {
	case SGD:
		return optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(0.1)
	case Adam:
		return optimizers.Adam().LearningRate(0.01).Done()
	}
	panic(fmt.Sprintf("testmodel: unknown optimizer %q", kind))
}

// CopyParams creates in dst a variable with the value of every variable in vars (same scope and name), so
// a reference model starts from the same weights.
func CopyParams(dst *context.Context, vars []*context.Variable) error {
	for _, v := range vars {
		value, err := v.Value()
		if err != nil {
			return err
		}
		clone, err := value.LocalClone()
		if err != nil {
			return err
		}
		dst.InAbsPath(v.Scope()).Checked(false).VariableWithValue(v.Name(), clone)
	}
	return nil
}

// ReferenceTrain trains with GoMLX's own train.Trainer, one optimizer step per given batch: the result a
// distributed, accumulating run must reproduce.
func ReferenceTrain(backend gomlxbackends.Backend, ctx *context.Context, kind OptimizerKind, batches [][2]*tensors.Tensor) error {
	return ReferenceTrainWithLoss(backend, ctx, kind, Loss, batches)
}

// ReferenceTrainWithLoss is ReferenceTrain with another loss.
func ReferenceTrainWithLoss(backend gomlxbackends.Backend, ctx *context.Context, kind OptimizerKind, loss losses.LossFn,
	batches [][2]*tensors.Tensor) error {
	trainer := train.NewTrainer(backend, ctx.Checked(false),
		func(ctx *context.Context, _ any, inputs []*Node) []*Node { return MLP(ctx, inputs) },
		loss, NewOptimizer(kind), nil, nil)
	for i, b := range batches {
		if _, err := trainer.TrainStep(nil, []*tensors.Tensor{b[0]}, []*tensors.Tensor{b[1]}); err != nil {
			return fmt.Errorf("reference step %d: %w", i, err)
		}
	}
	return nil
}

// MaxRelativeError compares every variable of got with the variable of the same scope and name in want:
// max |got-want| / max(max |want|, 1e-6) over each variable, the worst across variables, and its name.
func MaxRelativeError(got []*context.Variable, want *context.Context) (worst float64, name string, err error) {
	for _, v := range got {
		w := want.GetVariableByScopeAndName(v.Scope(), v.Name())
		if w == nil {
			return 0, "", fmt.Errorf("reference has no variable %q", v.ScopeAndName())
		}
		a, err := FlatFloat64(v)
		if err != nil {
			return 0, "", err
		}
		b, err := FlatFloat64(w)
		if err != nil {
			return 0, "", err
		}
		if len(a) != len(b) {
			return 0, "", fmt.Errorf("variable %q has %d values, reference %d", v.ScopeAndName(), len(a), len(b))
		}
		scale, diff := 1e-6, 0.0
		for i := range a {
			scale = math.Max(scale, math.Abs(b[i]))
			diff = math.Max(diff, math.Abs(a[i]-b[i]))
		}
		if rel := diff / scale; rel > worst || math.IsNaN(rel) {
			worst, name = rel, v.ScopeAndName()
		}
	}
	return worst, name, nil
}

// FlatFloat64 returns a variable's values as float64s, whatever their float or int64 dtype.
func FlatFloat64(v *context.Variable) ([]float64, error) {
	t, err := v.Value()
	if err != nil {
		return nil, err
	}
	var out []float64
	err = t.ConstFlatData(func(flat any) {
		switch f := flat.(type) {
		case []float32:
			for _, x := range f {
				out = append(out, float64(x))
			}
		case []float64:
			out = append(out, f...)
		case []int64:
			for _, x := range f {
				out = append(out, float64(x))
			}
		}
	})
	return out, err
}
