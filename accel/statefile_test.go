package accel

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
)

// validState is a format-2 state.json as SaveState writes it: one model, one optimizer, one loader.
func validState(t testing.TB) []byte {
	s := savedState{Format: stateFormat, SavedCycle: accumulate.SavedCycle{WorldSize: 2, Steps: 4,
		Position: accumulate.Position{StepInCycle: 1, ScaledMicroBatches: 1}}, BucketCapMB: 25, Seed: 7,
		Backend: "SimpleGo (go)",
		Models: []savedModel{{Dir: "model-0", Plan: []string{"param 0 /w (Float32)[2]"},
			SavedAccumulators: accumulate.SavedAccumulators{Accumulating: true}}},
		Optimizers: []savedOptimizer{{Model: 0, Steps: 3}},
		Loaders:    []savedLoader{{Epoch: 1, Consumed: 96, BatchSize: 8, Examples: 256}}}
	data, err := json.Marshal(s)
	require.NoError(t, err)
	return data
}

// edit applies fn to the JSON object of data and returns it encoded again.
func edit(t testing.TB, data []byte, fn func(map[string]any)) []byte {
	var m map[string]any
	require.NoError(t, json.Unmarshal(data, &m))
	fn(m)
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return out
}

func loader0(m map[string]any) map[string]any { return m["loaders"].([]any)[0].(map[string]any) }

func model0(m map[string]any) map[string]any { return m["models"].([]any)[0].(map[string]any) }

// validStateWithRNG is validState with every rank's generator state, as SaveState writes it for a model
// that draws random numbers (dropout).
func validStateWithRNG(t testing.TB) []byte {
	var s savedState
	require.NoError(t, json.Unmarshal(validState(t), &s))
	s.Models[0].RNGStates = [][]uint64{{1, 2, 3}, {1 << 63, 1<<64 - 1, 0}}
	data, err := json.Marshal(s)
	require.NoError(t, err)
	return data
}

// TestParseState: state.json as SaveState writes it (both formats, with every rank's generator state or
// without) is read; a file relabelled to the other format, missing a field its format requires, or holding
// counts SaveState never writes (generator states of another number of ranks, or of another size) is
// refused with a message naming what is wrong, where before it decoded to zeros and resumed at example 0.
func TestParseState(t *testing.T) {
	valid := validState(t)
	s, err := parseState(valid)
	require.NoError(t, err)
	assert.Equal(t, 96, s.Loaders[0].Consumed)
	assert.True(t, s.Models[0].Accumulating)
	assert.Nil(t, s.Models[0].RNGStates, "a checkpoint without generator states is read")
	s, err = parseState(validStateWithRNG(t))
	require.NoError(t, err)
	assert.Equal(t, [][]uint64{{1, 2, 3}, {1 << 63, 1<<64 - 1, 0}}, s.Models[0].RNGStates, "64-bit words are exact")
	for _, dir := range []string{"mid-cycle", "epoch-end"} {
		data, err := os.ReadFile("testdata/format1/" + dir + "/state.json")
		require.NoError(t, err)
		_, err = parseState(data)
		assert.NoError(t, err, "format 1 as it was written (%s)", dir)
	}

	for _, tc := range []struct {
		name string
		edit func(map[string]any)
		want string
	}{
		{"relabelled format 1", func(m map[string]any) { m["format"] = 1 }, `other format's field "consumed"`},
		{"consumed removed", func(m map[string]any) { delete(loader0(m), "consumed") }, `"consumed" is missing`},
		{"epoch removed", func(m map[string]any) { delete(loader0(m), "epoch") }, `"epoch" is missing`},
		{"a format-1 place in format 2", func(m map[string]any) { loader0(m)["position"] = 3 }, `field "position"`},
		{"world size removed", func(m map[string]any) { delete(m, "world_size") }, `"world_size" is missing`},
		{"gradient removed", func(m map[string]any) { delete(m, "gradient") }, `"gradient" is missing`},
		{"accumulating removed", func(m map[string]any) {
			delete(m["models"].([]any)[0].(map[string]any), "accumulating")
		}, `model 0: field "accumulating" is missing`},
		{"unknown format", func(m map[string]any) { m["format"] = 3 }, "state format 3"},
		{"no processes", func(m map[string]any) { m["world_size"] = 0 }, "saved by 0 processes"},
		{"K of zero", func(m map[string]any) { m["accumulation_steps"] = 0 }, "0 accumulation steps"},
		{"position past the cycle", func(m map[string]any) {
			m["gradient"].(map[string]any)["step_in_cycle"] = 4
		}, "outside a cycle"},
		{"optimizer of a missing model", func(m map[string]any) {
			m["optimizers"].([]any)[0].(map[string]any)["model"] = 1
		}, "optimizer 0: model 1 of 1"},
		{"negative place", func(m map[string]any) { loader0(m)["consumed"] = -8 }, "negative"},
		{"generator states of another world size", func(m map[string]any) {
			model0(m)["rng_states"] = [][]uint64{{1, 2, 3}}
		}, "random number generator states of 1 ranks, saved by 2 processes"},
		{"a short generator state", func(m map[string]any) {
			model0(m)["rng_states"] = [][]uint64{{1, 2, 3}, {4, 5}}
		}, "model 0, rank 1: prepare: a random number generator state of 2 words"},
		{"generator states in format 1", func(m map[string]any) {
			m["format"] = 1
			model0(m)["rng_states"] = [][]uint64{{1, 2, 3}, {4, 5, 6}}
		}, `format 2's field "rng_states"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseState(edit(t, valid, tc.edit))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// FuzzParseState: whatever bytes state.json holds, parseState returns an error or a state whose counts
// are in range, and never panics; a state it accepts reads back the same after SaveState's encoding.
func FuzzParseState(f *testing.F) {
	f.Add(validState(f))
	f.Add(validStateWithRNG(f))
	for _, dir := range []string{"mid-cycle", "epoch-end"} {
		if data, err := os.ReadFile("testdata/format1/" + dir + "/state.json"); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"format":2,"loaders":[{"epoch":0}]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"format":1,"world_size":1,"accumulation_steps":1,"sync_each_batch":false,"seed":0,` +
		`"gradient":{},"models":[],"optimizers":[],"loaders":[{"epoch":0,"position":0}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := parseState(data)
		if err != nil {
			assert.NotEmpty(t, strings.TrimSpace(err.Error()))
			return
		}
		assert.GreaterOrEqual(t, s.WorldSize, 1)
		assert.GreaterOrEqual(t, s.Steps, 1)
		assert.Less(t, s.Position.StepInCycle, s.Steps)
		for _, o := range s.Optimizers {
			assert.Less(t, o.Model, len(s.Models))
		}
		for _, l := range s.Loaders {
			assert.GreaterOrEqual(t, l.Consumed, 0)
			assert.GreaterOrEqual(t, l.Epoch, 0)
		}
		again, err := json.Marshal(s)
		require.NoError(t, err)
		if s.Format == stateFormat {
			back, err := parseState(again)
			require.NoError(t, err, "SaveState's encoding of an accepted state must be accepted: %s", again)
			assert.Equal(t, s, back)
		}
	})
}
