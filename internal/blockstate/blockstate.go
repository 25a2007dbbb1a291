// Package blockstate lays out and moves the optimizer state a sharding strategy splits into per-process
// blocks (ZeRO): which variables hold it, this process's blocks as a checkpoint saves them, and the two
// conversions a checkpoint of one layout needs to load into a run of the other (blocks of any number of
// processes, or one variable per parameter). A model's blocks are described by a Layout, built from the
// prepared model's public accessors.
package blockstate

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"

	"github.com/goaccel/goaccel/accumulate"
)

// Scope is the absolute context scope of a sharding strategy's per-process blocks: the synced gradients'
// block of each bucket ("grad_NNN") and the parameters' ("param_NNN", the trainable variables the
// optimizer's update runs on); the optimizer's state for them lives in its own scope ending with this one
// ("/adam/goaccel/shards").
const Scope = "/goaccel/shards"

// Layout is what places a model's blocks: its context, bucket plan and parameters (the plan's order), the
// strategy, and this process's rank among size.
type Layout struct {
	Ctx        *context.Context
	Plan       accumulate.Plan
	Params     []*context.Variable
	Sharding   accumulate.Sharding
	Rank, Size int
}

// Sharded reports whether the layout splits buckets into blocks.
func (m Layout) Sharded() bool { return m.Sharding != nil && m.Sharding.Stage() > 0 }

// IsBlockVariable reports whether v is one of a process's blocks, or the optimizer's state for one:
// per-process, never broadcast, saved block by block.
func IsBlockVariable(v *context.Variable) bool { return strings.HasSuffix(v.Scope(), Scope) }

// ParamBlockName and GradBlockName name bucket b's parameter and gradient blocks in Scope.
func ParamBlockName(b int) string { return fmt.Sprintf("param_%03d", b) }

// GradBlockName names bucket b's block of the synced gradients in Scope.
func GradBlockName(b int) string { return fmt.Sprintf("grad_%03d", b) }

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
func (m Layout) StateSlots() []StateSlot {
	states := m.blockStates()
	if len(states) == 0 {
		return nil
	}
	var slots []StateSlot
	for _, v := range states[0] {
		slots = append(slots, v.slot)
	}
	return slots
}

// blockState is one variable of optimizer state for a bucket's block, and its kind.
type blockState struct {
	slot StateSlot
	v    *context.Variable
}

// blockStates are the optimizer's state variables for each bucket's parameter block, indexed by bucket and
// sorted by slot, found in one pass over the context (nil unless the strategy splits buckets).
func (m Layout) blockStates() [][]blockState {
	if !m.Sharded() {
		return nil
	}
	states := make([][]blockState, len(m.Plan.Buckets))
	for v := range m.Ctx.IterVariables() {
		scope := v.Scope()
		if scope == Scope || !strings.HasSuffix(scope, Scope) {
			continue
		}
		// The name is ParamBlockName(b) followed by the slot's suffix ("param_003_1st_moment").
		digits, _, ok := strings.Cut(strings.TrimPrefix(v.Name(), "param_"), "_")
		b, err := strconv.Atoi(digits)
		if !ok || err != nil || b < 0 || b >= len(states) || !strings.HasPrefix(v.Name(), ParamBlockName(b)+"_") {
			continue
		}
		states[b] = append(states[b], blockState{v: v, slot: StateSlot{Prefix: strings.TrimSuffix(scope, Scope),
			Suffix: strings.TrimPrefix(v.Name(), ParamBlockName(b)), DType: v.Shape().DType}})
	}
	for _, bucket := range states {
		slices.SortFunc(bucket, func(a, b blockState) int {
			return strings.Compare(a.slot.Prefix+"\x00"+a.slot.Suffix, b.slot.Prefix+"\x00"+b.slot.Suffix)
		})
	}
	return states
}

// SlotParameterName is the name (as GoMLX's checkpoints key it) of the variable a replicated run keeps
// slot's state of parameter p in.
func (m Layout) SlotParameterName(slot StateSlot, p int) string {
	v := m.Params[p]
	return context.VariableParameterNameFromScopeAndName(slot.Prefix+v.Scope(), v.Name()+slot.Suffix)
}

// BlockState is this rank's optimizer state under a strategy that splits buckets: for each slot
// (StateSlots' order), for each bucket, the real elements of this rank's block (Sharding.Owned), end to
// end. Together the ranks' BlockStates hold each slot's state once, which ReadBlockState's source
// reassembles for any number of processes.
func (m Layout) BlockState() ([]byte, error) {
	var out []byte
	size, rank := m.Size, m.Rank
	all := m.blockStates()
	slots := m.StateSlots()
	for k := range slots {
		for b, bucket := range m.Plan.Buckets {
			states := all[b]
			if len(states) != len(slots) || states[k].slot != slots[k] {
				return nil, fmt.Errorf("blockstate: bucket %d's optimizer state is not that of bucket 0", b)
			}
			from, to := m.Sharding.Owned(bucket.Size, rank, size)
			t, err := states[k].v.Value()
			if err != nil {
				return nil, err
			}
			elem := slots[k].DType.Size()
			err = t.ConstBytes(func(data []byte) { out = append(out, data[:(to-from)*elem]...) })
			if err != nil {
				return nil, fmt.Errorf("blockstate: optimizer state %q: %w", states[k].v.ScopeAndName(), err)
			}
		}
	}
	return out, nil
}

// BlockStateLen is the length in bytes of the BlockState of rank among size ranks, for slots.
func (m Layout) BlockStateLen(slots []StateSlot, rank, size int) int {
	n := 0
	for _, slot := range slots {
		for _, bucket := range m.Plan.Buckets {
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
func (m Layout) ReadBlockState(read SlotReader) (map[*context.Variable]*tensors.Tensor, error) {
	size, rank := m.Size, m.Rank
	values := map[*context.Variable]*tensors.Tensor{}
	all := m.blockStates()
	for b, bucket := range m.Plan.Buckets {
		from, to := m.Sharding.Owned(bucket.Size, rank, size)
		for _, st := range all[b] {
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
func (m Layout) ReadSlotFromParameters(values map[string][]byte) SlotReader {
	return func(slot StateSlot, b, from, to int, dst []byte) error {
		elem := slot.DType.Size()
		for _, s := range m.Plan.Buckets[b].Slots {
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
func (m Layout) SlotToParameters(slot StateSlot, read SlotReader) (map[string]*tensors.Tensor, error) {
	values := map[string]*tensors.Tensor{}
	elem := slot.DType.Size()
	for b, bucket := range m.Plan.Buckets {
		for _, s := range bucket.Slots {
			shape := m.Plan.Params[s.Param].Shape.Clone()
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

// BlockVariables are the model's per-process block variables (parameter and gradient blocks, and the
// optimizer's state for them): what a checkpoint does not save with the replicated variables.
func (m Layout) BlockVariables() []*context.Variable {
	var vars []*context.Variable
	for v := range m.Ctx.IterVariables() {
		if IsBlockVariable(v) {
			vars = append(vars, v)
		}
	}
	return vars
}

// OptimizerStateBytes is the size of the per-parameter optimizer state this process holds for the model
// (Adam's moments: 8 bytes per float32 parameter when replicated, 1/N of that in blocks).
func (m Layout) OptimizerStateBytes() int64 {
	// The variables the state is kept for: the parameters, or under a strategy that splits buckets the
	// parameter blocks.
	owners := m.Params
	if m.Sharded() {
		owners = nil
		for u := range m.Ctx.IterVariables() {
			if u.Trainable && u.Scope() == Scope {
				owners = append(owners, u)
			}
		}
	}
	var n int64
	for v := range m.Ctx.IterVariables() {
		if !v.Trainable && v.Scope() != Scope && isSlotOf(v, owners) {
			n += int64(v.Shape().Memory())
		}
	}
	return n
}

// isSlotOf reports whether v is per-parameter optimizer state of one of owners: named after it, of its
// shape, in a scope that ends with its scope.
func isSlotOf(v *context.Variable, owners []*context.Variable) bool {
	for _, p := range owners {
		if strings.HasPrefix(v.Name(), p.Name()+"_") && strings.HasSuffix(v.Scope(), p.Scope()) &&
			v.Scope() != p.Scope() && slices.Equal(v.Shape().Dimensions, p.Shape().Dimensions) {
			return true
		}
	}
	return false
}
