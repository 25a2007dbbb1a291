package accel

import (
	"fmt"

	"github.com/goaccel/goaccel/userstate"
)

// RegisterForCheckpointing adds v, under name, to what SaveState saves and LoadState restores: the loop's
// own state (a best accuracy, an early-stopping counter, a running loss, a random generator), as
// Accelerate's register_for_checkpointing. Register each value once, on every process, in the same order,
// before LoadState; the name identifies it in checkpoints and must be unique.
//
// By default a value is the same on every process: SaveState checks that every process marshals it to the
// same bytes (and fails, naming it, when they differ) and saves it once; LoadState gives it to every
// process. With userstate.PerRank() every process's value is saved and each gets its own back; on another
// number of processes the checkpoint is refused, naming the value, unless userstate.Resize says how the
// saved values map onto the new processes.
//
// LoadState restores registered values with the same all-or-nothing guarantee as the rest: a checkpoint
// that lacks a registered name, or holds a name this run did not register, is refused by name; each
// value's bytes are first unmarshalled into a fresh value of its type (register pointers), and only when
// every process accepted all of them do the registered values change (see package userstate for the
// contract UnmarshalBinary keeps).
func (a *Accelerator) RegisterForCheckpointing(name string, v userstate.Value, opts ...userstate.Option) error {
	if err := a.checkOpen(); err != nil {
		return err
	}
	if err := a.userState.Register(name, v, opts...); err != nil {
		return fmt.Errorf("accel: %w", err)
	}
	return nil
}
