package prepare

import (
	"fmt"
	"slices"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
)

// The random numbers a model draws while it trains — GoMLX's dropout layers (layers.Dropout,
// layers.DropoutStatic, fnn's and attention's Dropout, layers.DropBlock) and anything else calling
// ctx.RandomUniform and friends — come from one generator state, the variable context.RNGStateVariableName at
// the root scope of the model's context. Each compiled training step reads it and writes it back advanced.
//
// That state is per rank, as each PyTorch DDP process has its own generator: ranks that drew the same masks
// would waste the job's extra data on identical noise. When a model is built, rank 0's state (which the
// Accelerator seeds from the job's seed, and the initializers then advance) is broadcast with the weights,
// and every rank r then takes DeriveRNGState(that state, r): rank 0 keeps it, so that one process draws
// what GoMLX's own Trainer would, and the other ranks take streams of their own. A run is therefore
// reproducible from its seed, and the weights stay identical on every rank, since only the averaged
// gradients reach them. The state is left out of ReplicatedVariables, and checkpoints keep every rank's.

// RNGStateParameterName is the parameter name (as GoMLX checkpoints store it) of a context's random number
// generator state.
var RNGStateParameterName = context.VariableParameterNameFromScopeAndName(context.RootScope,
	context.RNGStateVariableName)

// isRNGVariable reports whether v is its context's random number generator state.
func isRNGVariable(v *context.Variable) bool {
	return v.Scope() == context.RootScope && v.Name() == context.RNGStateVariableName
}

// RNGVariable is the random number generator state of the model's context, or nil when the context has
// none (nothing in the model or its initializers drew random numbers).
func (m *Model) RNGVariable() *context.Variable {
	return m.ctx.GetVariableByScopeAndName(context.RootScope, context.RNGStateVariableName)
}

// RNGState returns this rank's random number generator state (nil when the model has none), as the words
// checkpoints keep.
func (m *Model) RNGState() ([]uint64, error) {
	v := m.RNGVariable()
	if v == nil || !v.HasValue() {
		return nil, nil
	}
	t, err := v.Value()
	if err != nil {
		return nil, fmt.Errorf("prepare: random number generator state: %w", err)
	}
	if err := checkRNGShape(t); err != nil {
		return nil, err
	}
	return tensors.CopyFlatData[uint64](t)
}

// SetRNGState sets this rank's random number generator state (see RNGState). A model without one ignores
// it: it draws no random numbers.
func (m *Model) SetRNGState(state []uint64) error {
	v := m.RNGVariable()
	if v == nil {
		return nil
	}
	if err := CheckRNGState(state); err != nil {
		return err
	}
	if err := v.SetValue(tensors.FromFlatDataAndDimensions(slices.Clone(state), len(state))); err != nil {
		return fmt.Errorf("prepare: setting the random number generator state: %w", err)
	}
	return nil
}

// CheckRNGState refuses a state that is not shaped as GoMLX's generator state (graph.RNGStateShape).
func CheckRNGState(state []uint64) error {
	if want := graph.RNGStateShape; want.DType != dtypes.Uint64 || len(state) != want.Size() {
		return fmt.Errorf("prepare: a random number generator state of %d words, GoMLX's is %s", len(state), want)
	}
	return nil
}

func checkRNGShape(t *tensors.Tensor) error {
	if !t.Shape().Equal(graph.RNGStateShape) {
		return fmt.Errorf("prepare: the random number generator state is %s, GoMLX's is %s", t.Shape(),
			graph.RNGStateShape)
	}
	return nil
}

// DeriveRNGState is the generator state rank takes from base, the state every rank shares: rank 0 keeps
// base, every other rank takes base with each word mixed with the rank (SplitMix64), a stream of its own.
func DeriveRNGState(base []uint64, rank int) []uint64 {
	out := slices.Clone(base)
	if rank == 0 {
		return out
	}
	key := splitMix64(uint64(rank) ^ 0x676f616363656c00) // "goaccel\0": no other use of SplitMix64 collides
	for i := range out {
		key = splitMix64(key)
		out[i] = splitMix64(out[i] ^ key)
	}
	return out
}

// RankRNGState is the generator state rank takes from a checkpoint's states, saved[r] being the state of
// rank r of the run that saved it: its own when the saving run had that rank, else the state
// DeriveRNGState gives it from saved rank 0's. That is how a run resumes on another number of processes.
func RankRNGState(saved [][]uint64, rank int) ([]uint64, error) {
	if len(saved) == 0 {
		return nil, fmt.Errorf("prepare: no random number generator state saved")
	}
	for r, state := range saved {
		if err := CheckRNGState(state); err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	if rank < len(saved) {
		return slices.Clone(saved[rank]), nil
	}
	return DeriveRNGState(saved[0], rank), nil
}

// seedRank gives this rank its own generator stream, from the state every rank now shares (rank 0's,
// just broadcast).
func (m *Model) seedRank() error {
	rank := m.rt.Comm.Rank()
	if rank == 0 {
		return nil
	}
	state, err := m.RNGState()
	if err != nil || state == nil {
		return err
	}
	return m.SetRNGState(DeriveRNGState(state, rank))
}

// splitMix64 is one step of Steele, Lea and Flood's SplitMix64 generator: a bijection of the 64-bit words
// that scatters nearby inputs.
func splitMix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
