// Package userstate keeps the values a training program registers to travel with its checkpoints — a best
// accuracy, an early-stopping counter, a running metric, a random generator — as Accelerate's
// register_for_checkpointing does: the library's own state (weights, optimizer, data position) is saved
// without the program's help, the loop's own state needs it.
//
// A value is anything with encoding.BinaryMarshaler and encoding.BinaryUnmarshaler, registered once under a
// name that identifies it in checkpoints. A value is either the same on every process (saved once, from
// the main process, after checking that every process has the same bytes) or, with PerRank, each process's
// own (saved for every process, and given back to each).
//
// Restoring is all or nothing, with any user type: Plan unmarshals every value's saved bytes into a fresh
// value of its type first, so that bytes a value would refuse are found before anything changes; Apply
// then unmarshals into the registered values and, if one refuses anyway, sets back those it already set
// from the bytes they marshalled to before. The contract for UnmarshalBinary that makes this hold: it
// accepts or refuses bytes by the bytes alone (as the standard library's types do), and a refusal leaves
// the value as it was, or at least leaves it able to take the bytes it marshalled to before.
package userstate

import (
	"bytes"
	"crypto/sha256"
	"encoding"
	"encoding/gob"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/replicas"
)

// Value is what a program registers: its state as bytes and back.
type Value interface {
	encoding.BinaryMarshaler
	encoding.BinaryUnmarshaler
}

// Option configures one registered value.
type Option func(*entry)

// PerRank registers a value that differs between processes (a per-process running sum, a random generator
// seeded by rank): every process's bytes are saved, and each process gets its own back. On another number
// of processes LoadState refuses the checkpoint, naming the value, unless the value has a Resize.
func PerRank() Option { return func(e *entry) { e.perRank = true } }

// ResizeFunc gives a per-process value of a checkpoint saved by len(saved) processes its bytes on rank of a
// run of worldSize processes, from every saved process's bytes: summing counters into rank 0, say, or
// giving rank r the saved rank r's generator when there is one and a fresh seed otherwise. Its result is
// checked like saved bytes before anything changes.
type ResizeFunc func(saved [][]byte, rank, worldSize int) ([]byte, error)

// Resize lets a PerRank value resume on a number of processes other than the one that saved it.
func Resize(fn ResizeFunc) Option { return func(e *entry) { e.resize = fn } }

// Optional lets a checkpoint lack the value, as a config file may lack a field added since it was written:
// loading a checkpoint saved by a run that did not register it leaves the value as the program set it (its
// default). Without it such a checkpoint is refused, naming the value, so that a value the program relies on
// is never silently left at its default.
func Optional() Option { return func(e *entry) { e.optional = true } }

type entry struct {
	name     string
	value    Value
	perRank  bool
	optional bool
	resize   ResizeFunc
}

func (e *entry) scope() string {
	if e.perRank {
		return "per process"
	}
	return "once"
}

// Registry holds a program's registered values, in registration order.
type Registry struct {
	entries []*entry
}

// Register adds v under name. Names are unique and not empty; v must not be nil. A value that is a pointer
// (the usual case: methods on *T) is checked against the saved bytes through a fresh *T before anything is
// restored; any other value is restored directly, with only Apply's setting back to protect it.
func (r *Registry) Register(name string, v Value, opts ...Option) error {
	switch {
	case strings.TrimSpace(name) == "":
		return errors.New("userstate: a registered value needs a name, which identifies it in checkpoints")
	case v == nil || isNilPointer(v):
		return fmt.Errorf("userstate: value %q is nil", name)
	}
	for _, e := range r.entries {
		if e.name == name {
			return fmt.Errorf("userstate: a value named %q is registered already: names identify values in "+
				"checkpoints and must be unique", name)
		}
	}
	e := &entry{name: name, value: v}
	for _, opt := range opts {
		opt(e)
	}
	if e.resize != nil && !e.perRank {
		return fmt.Errorf("userstate: value %q has a Resize but is not PerRank: a value saved once is the same "+
			"on any number of processes", name)
	}
	r.entries = append(r.entries, e)
	return nil
}

func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// Names lists the registered names, in registration order.
func (r *Registry) Names() []string {
	names := make([]string, len(r.entries))
	for i, e := range r.entries {
		names[i] = e.name
	}
	return names
}

// Saved is what a checkpoint holds of the registered values.
type Saved struct {
	Values []SavedValue
}

// SavedValue is one value of a checkpoint: Data holds one element for a value saved once, one per saving
// process (by rank) for a per-process value.
type SavedValue struct {
	Name    string
	PerRank bool
	Data    [][]byte
}

// Collect marshals every registered value, checks that each value saved once has the same bytes on every
// process, and gathers the per-process values onto the main process (rank 0), where the result is
// complete; other ranks get the same names and scopes without the other ranks' bytes. Every rank returns
// the same error when a value cannot be marshalled on some rank or differs between ranks. Collective.
func (r *Registry) Collect(comm *backends.Communicator) (Saved, error) {
	mine := make([][]byte, len(r.entries))
	var marshalErr error
	for i, e := range r.entries {
		data, err := marshal(e)
		if err != nil {
			marshalErr = err
			break
		}
		mine[i] = data
	}
	if err := replicas.Agree(comm, "userstate: saving the registered values", marshalErr); err != nil {
		return Saved{}, err
	}
	// Every rank must register the same values, and a value saved once must be the same everywhere: saving
	// rank 0's and giving it to every rank on load would silently change the others'.
	lines := make([]string, len(r.entries))
	for i, e := range r.entries {
		lines[i] = fmt.Sprintf("%s, saved %s", e.name, e.scope())
		if !e.perRank {
			sum := sha256.Sum256(mine[i])
			lines[i] += fmt.Sprintf(", bytes with sha256 %x…", sum[:8])
		}
	}
	if err := replicas.CheckSameSignature(comm, "values registered for checkpointing", lines); err != nil {
		return Saved{}, fmt.Errorf("userstate: %w: every process registers the same names, and a value that "+
			"differs between processes is registered per process (PerRank)", err)
	}
	var perRank [][]byte
	for i, e := range r.entries {
		if e.perRank {
			perRank = append(perRank, mine[i])
		}
	}
	var all [][][]byte // by rank, then per-process value
	if slices.ContainsFunc(r.entries, func(e *entry) bool { return e.perRank }) {
		var buf bytes.Buffer
		if err := gob.NewEncoder(&buf).Encode(perRank); err != nil {
			return Saved{}, fmt.Errorf("userstate: %w", err)
		}
		blobs, err := replicas.AllGatherBytes(comm, buf.Bytes())
		if err != nil {
			return Saved{}, fmt.Errorf("userstate: gathering the per-process values: %w", err)
		}
		all = make([][][]byte, len(blobs))
		for rank, blob := range blobs {
			if err := gob.NewDecoder(bytes.NewReader(blob)).Decode(&all[rank]); err != nil {
				return Saved{}, fmt.Errorf("userstate: rank %d's per-process values: %w", rank, err)
			}
		}
	}
	var saved Saved
	p := 0
	for i, e := range r.entries {
		sv := SavedValue{Name: e.name, PerRank: e.perRank}
		switch {
		case !e.perRank:
			sv.Data = [][]byte{mine[i]}
		case comm.Rank() == 0:
			for rank := range all {
				sv.Data = append(sv.Data, all[rank][p])
			}
		}
		if e.perRank {
			p++
		}
		saved.Values = append(saved.Values, sv)
	}
	return saved, nil
}

// marshal is e's MarshalBinary, with a panic turned into an error naming the value.
func marshal(e *entry) (data []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("value %q: MarshalBinary panicked: %v", e.name, p)
		}
	}()
	if data, err = e.value.MarshalBinary(); err != nil {
		return nil, fmt.Errorf("value %q: MarshalBinary: %w", e.name, err)
	}
	return data, nil
}

// unmarshal is v's UnmarshalBinary, with a panic turned into an error.
func unmarshal(v Value, data []byte) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("UnmarshalBinary panicked: %v", p)
		}
	}()
	return v.UnmarshalBinary(data)
}

// Restore is a checked set of values to restore, ready to Apply.
type Restore struct {
	entries []*entry
	data    [][]byte
	// before holds each value's bytes from before Apply, for setting it back; applied counts those set.
	before  [][]byte
	applied int
}

// Plan checks a checkpoint's values against the registry for rank of a run of worldSize processes: every
// registered name is saved (unless Optional) and every saved name registered, with the same scope; a per-process value was
// saved by worldSize processes, or has a Resize; and each value's bytes are accepted by UnmarshalBinary on a
// fresh value of its type. It changes nothing.
func (r *Registry) Plan(saved Saved, rank, worldSize int) (*Restore, error) {
	byName := map[string]SavedValue{}
	for _, sv := range saved.Values {
		if _, twice := byName[sv.Name]; twice {
			return nil, fmt.Errorf("userstate: the checkpoint holds value %q twice", sv.Name)
		}
		byName[sv.Name] = sv
	}
	var unknown []string
	for _, sv := range saved.Values {
		if !slices.ContainsFunc(r.entries, func(e *entry) bool { return e.name == sv.Name }) {
			unknown = append(unknown, fmt.Sprintf("%q", sv.Name))
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("userstate: the checkpoint holds %s, which this run did not register: register "+
			"every value the saving run registered (RegisterForCheckpointing) before loading",
			strings.Join(unknown, ", "))
	}
	p := &Restore{}
	for _, e := range r.entries {
		sv, ok := byName[e.name]
		if !ok && e.optional {
			continue // keeps the program's own value
		}
		if !ok {
			return nil, fmt.Errorf("userstate: the checkpoint has no value %q, which this run registered: it was "+
				"saved by a run that did not register it (register it with Optional to let such a checkpoint "+
				"leave it at the program's value)", e.name)
		}
		if sv.PerRank != e.perRank {
			saved := "once"
			if sv.PerRank {
				saved = "per process"
			}
			return nil, fmt.Errorf("userstate: value %q was saved %s, this run registers it %s", e.name, saved, e.scope())
		}
		data, err := dataFor(e, sv, rank, worldSize)
		if err != nil {
			return nil, err
		}
		if fresh, ok := freshLike(e.value); ok {
			if err := unmarshal(fresh, data); err != nil {
				return nil, fmt.Errorf("userstate: value %q refuses the checkpoint's bytes: %w", e.name, err)
			}
		}
		p.entries = append(p.entries, e)
		p.data = append(p.data, data)
	}
	return p, nil
}

// dataFor picks rank's bytes of a saved value.
func dataFor(e *entry, sv SavedValue, rank, worldSize int) ([]byte, error) {
	if !e.perRank {
		if len(sv.Data) != 1 {
			return nil, fmt.Errorf("userstate: value %q is saved once but the checkpoint has %d copies", e.name, len(sv.Data))
		}
		return sv.Data[0], nil
	}
	if len(sv.Data) == worldSize {
		return sv.Data[rank], nil
	}
	if e.resize == nil {
		return nil, fmt.Errorf("userstate: value %q was saved per process by %d processes and this run has %d: "+
			"per-process values resume on the number of processes that saved them, unless registered with a "+
			"Resize that says how they move to another number (or register the value once if it is the same "+
			"on every process)", e.name, len(sv.Data), worldSize)
	}
	data, err := callResize(e, sv.Data, rank, worldSize)
	if err != nil {
		return nil, fmt.Errorf("userstate: value %q: resizing from %d to %d processes: %w", e.name, len(sv.Data),
			worldSize, err)
	}
	return data, nil
}

func callResize(e *entry, saved [][]byte, rank, worldSize int) (data []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("Resize panicked: %v", p)
		}
	}()
	return e.resize(saved, rank, worldSize)
}

// freshLike returns a new zero value of v's type when v is a pointer, for trying bytes on without touching v.
func freshLike(v Value) (Value, bool) {
	t := reflect.TypeOf(v)
	if t.Kind() != reflect.Pointer {
		return nil, false
	}
	fresh, ok := reflect.New(t.Elem()).Interface().(Value)
	return fresh, ok
}

// Apply unmarshals the checked bytes into the registered values, in registration order. If a value refuses
// its bytes after all, the values already set are set back (Undo) and the error names the value.
func (p *Restore) Apply() error {
	p.before = make([][]byte, len(p.entries))
	for i, e := range p.entries {
		before, err := marshal(e)
		if err != nil {
			_ = p.Undo()
			return fmt.Errorf("userstate: keeping %w to set it back on failure", err)
		}
		p.before[i] = before
	}
	for i, e := range p.entries {
		if err := unmarshal(e.value, p.data[i]); err != nil {
			// The value that failed may be half-set: it is set back too.
			p.applied = i + 1
			undoErr := p.Undo()
			return errors.Join(fmt.Errorf("userstate: value %q refused the checkpoint's bytes after accepting them "+
				"on a fresh value (its UnmarshalBinary must decide by the bytes alone): %w", e.name, err), undoErr)
		}
		p.applied = i + 1
	}
	return nil
}

// Undo sets every value Apply set back to the bytes it marshalled to before.
func (p *Restore) Undo() error {
	var errs []error
	for i := p.applied - 1; i >= 0; i-- {
		if err := unmarshal(p.entries[i].value, p.before[i]); err != nil {
			errs = append(errs, fmt.Errorf("userstate: setting value %q back: %w", p.entries[i].name, err))
		}
	}
	p.applied = 0
	return errors.Join(errs...)
}
