package accel

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/goaccel/goaccel/prepare"
)

// parseState decodes a checkpoint's state.json and checks it before anything reads it: every field its
// format requires is present, no field of the other format is, and every count is in range. The manifest's
// hashes say a file is the one written; they cannot say it was written by SaveState. A file relabelled to
// another format, or missing a field, would otherwise decode to zeros and resume silently at example 0.
func parseState(data []byte) (savedState, error) {
	var s savedState
	if err := json.Unmarshal(data, &s); err != nil {
		return s, err
	}
	var raw struct {
		Top        map[string]json.RawMessage
		Models     []map[string]json.RawMessage `json:"models"`
		Optimizers []map[string]json.RawMessage `json:"optimizers"`
		Loaders    []map[string]json.RawMessage `json:"loaders"`
	}
	if err := json.Unmarshal(data, &raw.Top); err != nil {
		return s, err
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return s, err
	}
	if s.Format != 1 && s.Format != stateFormat {
		return s, fmt.Errorf("state format %d, this version reads 1 and %d", s.Format, stateFormat)
	}
	if err := hasFields("", raw.Top, "format", "world_size", "accumulation_steps", "sync_each_batch", "seed",
		"gradient", "models", "optimizers", "loaders"); err != nil {
		return s, err
	}
	for i, m := range raw.Models {
		if err := hasFields(fmt.Sprintf("model %d: ", i), m, "dir", "plan", "accumulating"); err != nil {
			return s, err
		}
		if _, ok := m["rng_states"]; ok && s.Format == 1 {
			return s, fmt.Errorf("model %d: state format 1 with format %d's field \"rng_states\"", i, stateFormat)
		}
	}
	for i, o := range raw.Optimizers {
		if err := hasFields(fmt.Sprintf("optimizer %d: ", i), o, "model", "steps"); err != nil {
			return s, err
		}
	}
	// Format 1 places a loader by its batches per process, format 2 by the examples of the epoch's order.
	place, other := "consumed", "position"
	if s.Format == 1 {
		place, other = other, place
		if _, ok := raw.Top["user_values"]; ok {
			return s, fmt.Errorf("state format 1 with format %d's field \"user_values\"", stateFormat)
		}
	}
	for i, l := range raw.Loaders {
		what := fmt.Sprintf("loader %d: ", i)
		if _, ok := l[other]; ok {
			return s, fmt.Errorf("%sstate format %d with the other format's field %q", what, s.Format, other)
		}
		if err := hasFields(what, l, "epoch", place); err != nil {
			return s, err
		}
	}
	return s, checkStateRanges(s)
}

// hasFields says which of names m lacks.
func hasFields(what string, m map[string]json.RawMessage, names ...string) error {
	for _, name := range names {
		if _, ok := m[name]; !ok {
			return fmt.Errorf("%sfield %q is missing", what, name)
		}
	}
	return nil
}

// checkStateRanges refuses counts SaveState never writes.
func checkStateRanges(s savedState) error {
	g := s.Position
	switch {
	case s.WorldSize < 1:
		return fmt.Errorf("saved by %d processes", s.WorldSize)
	case s.Steps < 1:
		return fmt.Errorf("saved with %d accumulation steps", s.Steps)
	case g.StepInCycle < 0 || g.StepInCycle >= s.Steps || g.ScaledMicroBatches < 0 || g.UnscaledMicroBatches < 0:
		return fmt.Errorf("gradient position %+v is outside a cycle of %d micro-batches", g, s.Steps)
	}
	for i, m := range s.Models {
		if m.Dir == "" || len(m.Plan) == 0 {
			return fmt.Errorf("model %d has no directory or no plan", i)
		}
		// Every rank's generator state, or none (a model that draws no random numbers, an older checkpoint).
		if m.RNGStates != nil && len(m.RNGStates) != s.WorldSize {
			return fmt.Errorf("model %d has the random number generator states of %d ranks, saved by %d processes",
				i, len(m.RNGStates), s.WorldSize)
		}
		if err := checkSavedSharding(m.Sharding); err != nil {
			return fmt.Errorf("model %d: %w", i, err)
		}
		for r, state := range m.RNGStates {
			if err := prepare.CheckRNGState(state); err != nil {
				return fmt.Errorf("model %d, rank %d: %w", i, r, err)
			}
		}
	}
	for i, o := range s.Optimizers {
		if o.Model < 0 || o.Model >= len(s.Models) || o.Steps < 0 || o.Skipped < 0 {
			return fmt.Errorf("optimizer %d: model %d of %d, %d steps, %d skipped", i, o.Model, len(s.Models),
				o.Steps, o.Skipped)
		}
	}
	for i, l := range s.Loaders {
		if slices.ContainsFunc([]int{l.Epoch, l.Consumed, l.Position}, func(n int) bool { return n < 0 }) {
			return fmt.Errorf("loader %d: negative epoch or place (%+v)", i, l)
		}
	}
	return nil
}
