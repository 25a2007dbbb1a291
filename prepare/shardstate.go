package prepare

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"

	"github.com/goaccel/goaccel/accumulate"
)

// StateSlot is one kind of per-parameter optimizer state, such as Adam's first moment. GoMLX's optimizers
// keep it, for a trainable variable named name in scope, in a variable named name+Suffix in scope
// Prefix+scope, shaped like the variable (Adam: Prefix "/adam", Suffixes "_1st_moment" and
// "_2nd_moment"). A replicated run holds one such variable per parameter; a run under a strategy that
// splits buckets holds one per bucket, for this rank's block of the parameter blocks (see shard.go), and
// checkpoints save it block by block. The two name the same values, laid out differently: StateSlot is what
// lets a checkpoint of one be loaded into the other.
type StateSlot struct {
	Prefix string       `json:"prefix"`
	Suffix string       `json:"suffix"`
	DType  dtypes.DType `json:"dtype"`
}

// StateSlots are the kinds of per-parameter optimizer state this rank holds in blocks (nil unless the
// model's strategy splits buckets), in a fixed order: by prefix, then suffix.
func (m *Model) StateSlots() []StateSlot {
	var slots []StateSlot
	for _, v := range m.blockStateVariables(0) {
		slots = append(slots, v.slot)
	}
	return slots
}

// blockState is one variable of optimizer state for a bucket's block, and its kind.
type blockState struct {
	slot StateSlot
	v    *context.Variable
}

// blockStateVariables are the optimizer's state variables for bucket b's parameter block, sorted by slot.
func (m *Model) blockStateVariables(b int) []blockState {
	if m.sharding == nil || m.sharding.Stage() == 0 {
		return nil
	}
	name := fmt.Sprintf("param_%03d", b)
	var states []blockState
	for v := range m.ctx.IterVariables() {
		scope := v.Scope()
		if scope == shardScope || !strings.HasSuffix(scope, shardScope) || !strings.HasPrefix(v.Name(), name+"_") {
			continue
		}
		states = append(states, blockState{v: v, slot: StateSlot{Prefix: strings.TrimSuffix(scope, shardScope),
			Suffix: strings.TrimPrefix(v.Name(), name), DType: v.Shape().DType}})
	}
	slices.SortFunc(states, func(a, b blockState) int {
		return strings.Compare(a.slot.Prefix+"\x00"+a.slot.Suffix, b.slot.Prefix+"\x00"+b.slot.Suffix)
	})
	return states
}

// SlotParameterName is the name (as GoMLX's checkpoints key it) of the variable a replicated run keeps
// slot's state of parameter p in.
func (m *Model) SlotParameterName(slot StateSlot, p int) string {
	v := m.params[p]
	return context.VariableParameterNameFromScopeAndName(slot.Prefix+v.Scope(), v.Name()+slot.Suffix)
}

// BlockState is this rank's optimizer state under a strategy that splits buckets: for each slot
// (StateSlots' order), for each bucket, the real elements of this rank's block (Sharding.Owned), end to
// end. Together the ranks' BlockStates hold each slot's state once, which ReadBlockState's source
// reassembles for any number of processes.
func (m *Model) BlockState() ([]byte, error) {
	var out []byte
	size, rank := m.rt.Comm.Size(), m.rt.Comm.Rank()
	slots := m.StateSlots()
	for k := range slots {
		for b, bucket := range m.plan.Buckets {
			states := m.blockStateVariables(b)
			if len(states) != len(slots) || states[k].slot != slots[k] {
				return nil, fmt.Errorf("prepare: bucket %d's optimizer state is not that of bucket 0", b)
			}
			from, to := m.sharding.Owned(bucket.Size, rank, size)
			t, err := states[k].v.Value()
			if err != nil {
				return nil, err
			}
			elem := slots[k].DType.Size()
			err = t.ConstBytes(func(data []byte) { out = append(out, data[:(to-from)*elem]...) })
			if err != nil {
				return nil, fmt.Errorf("prepare: optimizer state %q: %w", states[k].v.ScopeAndName(), err)
			}
		}
	}
	return out, nil
}

// BlockStateLen is the length in bytes of the BlockState of rank among size ranks, for slots.
func (m *Model) BlockStateLen(slots []StateSlot, rank, size int) int {
	n := 0
	for _, slot := range slots {
		for _, bucket := range m.plan.Buckets {
			from, to := accumulate.ShardOptimizer{}.Owned(bucket.Size, rank, size)
			n += (to - from) * slot.DType.Size()
		}
	}
	return n
}

// SlotReader reads elements [from, to) of bucket b's flat layout of slot's state into dst ((to-from)
// elements of slot.DType).
type SlotReader func(slot StateSlot, b, from, to int, dst []byte) error

// ReadBlockState reads this rank's blocks of optimizer state from read (a checkpoint's, of any number of
// processes and either layout), as the values to set: nothing changes here. The padding past a bucket's end
// is zero.
func (m *Model) ReadBlockState(read SlotReader) (map[*context.Variable]*tensors.Tensor, error) {
	size, rank := m.rt.Comm.Size(), m.rt.Comm.Rank()
	values := map[*context.Variable]*tensors.Tensor{}
	for b, bucket := range m.plan.Buckets {
		from, to := m.sharding.Owned(bucket.Size, rank, size)
		for _, st := range m.blockStateVariables(b) {
			t := tensors.FromShape(st.v.Shape())
			var readErr error
			err := t.MutableBytes(func(data []byte) {
				readErr = read(st.slot, b, from, to, data[:(to-from)*st.slot.DType.Size()])
			})
			if err = errors.Join(err, readErr); err != nil {
				return nil, fmt.Errorf("optimizer state %q: %w", st.v.ScopeAndName(), err)
			}
			values[st.v] = t
		}
	}
	return values, nil
}

// ReadSlotFromParameters is a SlotReader over a replicated run's variables of slot state (values, keyed by
// SlotParameterName): the flat layout is cut from the parameters the bucket's slots hold.
func (m *Model) ReadSlotFromParameters(values map[string][]byte) SlotReader {
	return func(slot StateSlot, b, from, to int, dst []byte) error {
		elem := slot.DType.Size()
		for _, s := range m.plan.Buckets[b].Slots {
			lo, hi := max(from, s.Offset), min(to, s.Offset+s.Size)
			if lo >= hi {
				continue
			}
			name := m.SlotParameterName(slot, s.Param)
			data, ok := values[name]
			if !ok {
				return fmt.Errorf("the checkpoint has no optimizer state %q", name)
			}
			if len(data) != s.Size*elem {
				return fmt.Errorf("optimizer state %q has %d bytes, its parameter needs %d", name, len(data), s.Size*elem)
			}
			copy(dst[(lo-from)*elem:(hi-from)*elem], data[(lo-s.Offset)*elem:(hi-s.Offset)*elem])
		}
		return nil
	}
}

// SlotToParameters reassembles slot's state of every parameter, shaped as a replicated run keeps it, from
// read: the values a replicated run loads, keyed by SlotParameterName.
func (m *Model) SlotToParameters(slot StateSlot, read SlotReader) (map[string]*tensors.Tensor, error) {
	values := map[string]*tensors.Tensor{}
	elem := slot.DType.Size()
	for b, bucket := range m.plan.Buckets {
		for _, s := range bucket.Slots {
			shape := m.plan.Params[s.Param].Shape.Clone()
			shape.DType = slot.DType
			t := tensors.FromShape(shape)
			var readErr error
			err := t.MutableBytes(func(data []byte) {
				readErr = read(slot, b, s.Offset, s.Offset+s.Size, data[:s.Size*elem])
			})
			if err = errors.Join(err, readErr); err != nil {
				return nil, err
			}
			values[m.SlotParameterName(slot, s.Param)] = t
		}
	}
	return values, nil
}

// BlockVariables are the model's per-rank block variables (parameter and gradient blocks, and the
// optimizer's state for them): what a checkpoint does not save with the replicated variables.
func (m *Model) BlockVariables() []*context.Variable {
	var vars []*context.Variable
	for v := range m.ctx.IterVariables() {
		if isShardVariable(v) {
			vars = append(vars, v)
		}
	}
	return vars
}

// Sharding is the strategy the model's gradients and optimizer state are split with (Replicated on one
// process).
func (m *Model) Sharding() accumulate.Sharding { return m.sharding }

// OptimizerStateBytes is the size of the per-parameter optimizer state this process holds for the model
// (Adam's moments: 8 bytes per float32 parameter when replicated, 1/N of that in blocks).
func (m *Model) OptimizerStateBytes() int64 {
	if !m.materialized {
		return 0
	}
	var n int64
	for v := range m.ctx.IterVariables() {
		if v.Trainable || isBucketVariable(v) || v.Scope() == shardScope {
			continue
		}
		if m.isSlotVariable(v) {
			n += int64(v.Shape().Memory())
		}
	}
	return n
}

// isSlotVariable reports whether v is per-parameter optimizer state: named after a trainable variable of
// its own shape (a parameter, or a parameter block), in a scope that ends with that variable's scope.
func (m *Model) isSlotVariable(v *context.Variable) bool {
	owners := m.params
	if m.sharding != nil && m.sharding.Stage() > 0 {
		owners = nil
		for u := range m.ctx.IterVariables() {
			if u.Trainable && u.Scope() == shardScope {
				owners = append(owners, u)
			}
		}
	}
	for _, p := range owners {
		if strings.HasPrefix(v.Name(), p.Name()+"_") && strings.HasSuffix(v.Scope(), p.Scope()) &&
			v.Scope() != p.Scope() && slices.Equal(v.Shape().Dimensions, p.Shape().Dimensions) {
			return true
		}
	}
	return false
}
