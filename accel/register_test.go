package accel_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/userstate"
)

// tally is a program's value for the tests: a count, as 8 bytes. UnmarshalBinary refuses another length
// and negative counts; a locked tally refuses everything (a type that breaks the contract that bytes a
// fresh value accepts are accepted).
type tally struct {
	n      int64
	locked bool
}

func (t *tally) MarshalBinary() ([]byte, error) {
	return binary.BigEndian.AppendUint64(nil, uint64(t.n)), nil
}

func (t *tally) UnmarshalBinary(b []byte) error {
	if len(b) != 8 {
		return fmt.Errorf("tally: want 8 bytes, got %d", len(b))
	}
	n := int64(binary.BigEndian.Uint64(b))
	if n < 0 {
		return fmt.Errorf("tally: negative count %d", n)
	}
	if t.locked {
		return errors.New("tally: locked")
	}
	t.n = n
	return nil
}

// userValues is one rank's registered values: best is the same on every rank, seen is per rank.
type userValues struct {
	best, seen tally
}

func (u *userValues) register(acc *accel.Accelerator) error {
	if err := acc.RegisterForCheckpointing("best", &u.best); err != nil {
		return err
	}
	return acc.RegisterForCheckpointing("seen", &u.seen, userstate.PerRank())
}

// saveWithValues trains ranks processes one cycle-aligned step and saves with best=70 on every rank and
// seen=100+rank (or seenOf(rank)).
func saveWithValues(t *testing.T, ranks int, dir string, seenOf func(rank int) int64) {
	t.Helper()
	runRanks(t, ranks, nil, func(rank int, acc *accel.Accelerator) error {
		var u userValues
		if err := u.register(acc); err != nil {
			return err
		}
		r := prepareResumable(t, acc, 8*ranks, 2, 1)
		if _, err := r.train(acc, 1, 2); err != nil {
			return err
		}
		u.best.n, u.seen.n = 70, seenOf(rank)
		_, err := acc.SaveState(dir)
		return err
	})
}

// TestRegisteredValuesResume: a value registered once comes back on every rank, a per-rank one each rank's
// own; both live in the checkpoint's user/ directory, covered by its manifest.
func TestRegisteredValuesResume(t *testing.T) {
	dir := t.TempDir()
	saveWithValues(t, 2, dir, func(rank int) int64 { return int64(100 + rank) })
	latest, err := checkpoint.Latest(dir)
	require.NoError(t, err)
	manifest, err := checkpoint.Verify(latest)
	require.NoError(t, err)
	assert.Contains(t, manifest.Files, "user/000.bin")
	assert.Contains(t, manifest.Files, "user/001-rank-0.bin")
	assert.Contains(t, manifest.Files, "user/001-rank-1.bin")

	runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
		var u userValues
		require.NoError(t, u.register(acc))
		prepareResumable(t, acc, 16, 2, 1)
		if err := acc.LoadState(dir); err != nil {
			return err
		}
		assert.Equal(t, int64(70), u.best.n, "rank %d", rank)
		assert.Equal(t, int64(100+rank), u.seen.n, "rank %d gets its own", rank)
		return nil
	})

	t.Run("a damaged value file", func(t *testing.T) {
		copyDir := filepath.Join(t.TempDir(), "copy")
		require.NoError(t, os.CopyFS(copyDir, os.DirFS(latest)))
		require.NoError(t, os.WriteFile(filepath.Join(copyDir, "user", "000.bin"), []byte{0, 0, 0, 0, 0, 0, 0, 9}, 0o644))
		runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
			var u userValues
			require.NoError(t, u.register(acc))
			prepareResumable(t, acc, 16, 2, 1)
			err := acc.LoadState(copyDir)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "user/000.bin is damaged")
			assert.Zero(t, u.best.n)
			return nil
		})
	})
}

// TestRegisteredValuesAreMatchedByName: a checkpoint holding a value this run did not register, or lacking
// one it registered, is refused naming it, and nothing changes.
func TestRegisteredValuesAreMatchedByName(t *testing.T) {
	dir := t.TempDir()
	saveWithValues(t, 1, dir, func(int) int64 { return 3 })
	for _, tc := range []struct {
		name     string
		register func(acc *accel.Accelerator, u *userValues) error
		want     string
	}{
		{"not registered", func(acc *accel.Accelerator, u *userValues) error {
			return acc.RegisterForCheckpointing("best", &u.best)
		}, `holds "seen", which this run did not register`},
		{"not saved", func(acc *accel.Accelerator, u *userValues) error {
			if err := u.register(acc); err != nil {
				return err
			}
			return acc.RegisterForCheckpointing("patience", &tally{})
		}, `has no value "patience", which this run registered`},
		{"another scope", func(acc *accel.Accelerator, u *userValues) error {
			if err := acc.RegisterForCheckpointing("best", &u.best, userstate.PerRank()); err != nil {
				return err
			}
			return acc.RegisterForCheckpointing("seen", &u.seen, userstate.PerRank())
		}, `value "best" was saved once, this run registers it per process`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acc := newSingle(t)
			var u userValues
			require.NoError(t, tc.register(acc, &u))
			r := prepareResumable(t, acc, 8, 2, 1)
			err := acc.LoadState(dir)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Zero(t, u.best.n)
			assert.Zero(t, u.seen.n)
			assert.Zero(t, r.opt.Steps(), "nothing changed")
		})
	}
}

// TestRefusedValueChangesNothing: when one rank's saved value is bytes its type refuses, LoadState fails
// on every rank naming that rank and the value, and no rank changes anything: weights, optimizer, data
// position, gradient state, registered values.
func TestRefusedValueChangesNothing(t *testing.T) {
	dir := t.TempDir()
	saveWithValues(t, 2, dir, func(rank int) int64 { return []int64{5, -1}[rank] })
	errs := make([]error, 2)
	runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
		u := userValues{best: tally{n: 1}, seen: tally{n: 2}}
		require.NoError(t, u.register(acc))
		errs[rank] = loadChangesNothingOnRefusal(t, acc, prepareResumable(t, acc, 16, 2, 1), dir)
		assert.Equal(t, userValues{best: tally{n: 1}, seen: tally{n: 2}}, u, "rank %d", rank)
		return nil
	})
	for rank, err := range errs {
		require.Error(t, err, "rank %d", rank)
		assert.Contains(t, err.Error(), `rank 1: checkpoint`)
		assert.Contains(t, err.Error(), `value "seen" refuses the checkpoint's bytes: tally: negative count -1`)
	}
}

// TestLateRefusalIsSetBack: a value whose UnmarshalBinary accepts the bytes on a fresh value but refuses
// them on the registered one (breaking the contract) makes LoadState fail on every rank; the values set
// before it are set back, and the library's state is not touched.
func TestLateRefusalIsSetBack(t *testing.T) {
	dir := t.TempDir()
	saveWithValues(t, 2, dir, func(rank int) int64 { return 9 })
	errs := make([]error, 2)
	runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
		u := userValues{best: tally{n: 1}, seen: tally{n: 2, locked: rank == 1}}
		require.NoError(t, u.register(acc))
		r := prepareResumable(t, acc, 16, 2, 1)
		errs[rank] = acc.LoadState(dir)
		assert.Equal(t, int64(1), u.best.n, "rank %d: the value restored first is set back", rank)
		assert.Equal(t, int64(2), u.seen.n, "rank %d", rank)
		assert.Zero(t, r.opt.Steps(), "rank %d: the library's state is not touched", rank)
		return nil
	})
	for rank, err := range errs {
		require.Error(t, err, "rank %d", rank)
		assert.Contains(t, err.Error(), `rank 1: userstate: value "seen" refused the checkpoint's bytes after accepting them on a fresh value`)
	}
}

// TestOnceValueMustBeTheSameEverywhere: a value registered once whose bytes differ between ranks is
// refused by SaveState on every rank, naming it and PerRank, and no checkpoint is written.
func TestOnceValueMustBeTheSameEverywhere(t *testing.T) {
	dir := t.TempDir()
	errs := make([]error, 2)
	runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
		v := tally{n: int64(rank)}
		require.NoError(t, acc.RegisterForCheckpointing("loss-sum", &v))
		r := prepareResumable(t, acc, 16, 2, 1)
		if _, err := r.train(acc, 1, 1); err != nil {
			return err
		}
		_, errs[rank] = acc.SaveState(dir)
		return nil
	})
	for rank, err := range errs {
		require.Error(t, err, "rank %d", rank)
		assert.Contains(t, err.Error(), `loss-sum, saved once, bytes with sha256`)
		assert.Contains(t, err.Error(), "differs between processes is registered per process (PerRank)")
	}
	all, err := checkpoint.List(dir)
	require.NoError(t, err)
	assert.Empty(t, all)
}

// TestPerRankValuesOnAnotherWorldSize: per-process values saved by 2 processes are refused on 4, naming
// the value, unless registered with a Resize, which then gives each new rank its bytes.
func TestPerRankValuesOnAnotherWorldSize(t *testing.T) {
	dir := t.TempDir()
	saveWithValues(t, 2, dir, func(rank int) int64 { return int64(10 * (rank + 1)) })
	errs := make([]error, 4)
	runRanks(t, 4, nil, func(rank int, acc *accel.Accelerator) error {
		var u userValues
		require.NoError(t, u.register(acc))
		prepareResumable(t, acc, 16, 2, 1)
		errs[rank] = acc.LoadState(dir)
		return nil
	})
	for rank, err := range errs {
		require.Error(t, err, "rank %d", rank)
		assert.Contains(t, err.Error(), `value "seen" was saved per process by 2 processes and this run has 4`)
	}

	// Sum the saved counts into rank 0; the others start from zero.
	sumIntoRankZero := userstate.Resize(func(saved [][]byte, rank, worldSize int) ([]byte, error) {
		var total tally
		for _, b := range saved {
			var t tally
			if err := t.UnmarshalBinary(b); err != nil {
				return nil, err
			}
			total.n += t.n
		}
		if rank != 0 {
			total.n = 0
		}
		return total.MarshalBinary()
	})
	got := make([]int64, 4)
	runRanks(t, 4, nil, func(rank int, acc *accel.Accelerator) error {
		var u userValues
		require.NoError(t, acc.RegisterForCheckpointing("best", &u.best))
		require.NoError(t, acc.RegisterForCheckpointing("seen", &u.seen, userstate.PerRank(), sumIntoRankZero))
		prepareResumable(t, acc, 16, 2, 1)
		if err := acc.LoadState(dir); err != nil {
			return err
		}
		got[rank] = u.seen.n
		return nil
	})
	assert.Equal(t, []int64{30, 0, 0, 0}, got)
}

// TestRegisterForCheckpointingRefusesBadNames: names are unique and not empty, values not nil.
func TestRegisterForCheckpointingRefusesBadNames(t *testing.T) {
	acc := newSingle(t)
	require.NoError(t, acc.RegisterForCheckpointing("best", &tally{}))
	for _, tc := range []struct {
		name string
		v    userstate.Value
		want string
	}{
		{"best", &tally{}, `a value named "best" is registered already`},
		{" ", &tally{}, "needs a name"},
		{"nil", (*tally)(nil), `value "nil" is nil`},
		{"untyped nil", nil, `value "untyped nil" is nil`},
	} {
		err := acc.RegisterForCheckpointing(tc.name, tc.v)
		require.Error(t, err, tc.name)
		assert.Contains(t, err.Error(), tc.want)
	}
	err := acc.RegisterForCheckpointing("once", &tally{}, userstate.Resize(nil))
	assert.NoError(t, err, "a nil Resize is no Resize")
}

// TestStateJSONNamesRegisteredValues: state.json (format 2) lists every registered value by name with its
// files.
func TestStateJSONNamesRegisteredValues(t *testing.T) {
	dir := t.TempDir()
	saveWithValues(t, 2, dir, func(rank int) int64 { return 1 })
	latest, err := checkpoint.Latest(dir)
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(latest, "state.json"))
	require.NoError(t, err)
	var state struct {
		Format     int `json:"format"`
		UserValues []struct {
			Name    string   `json:"name"`
			PerRank bool     `json:"per_rank"`
			Files   []string `json:"files"`
		} `json:"user_values"`
		Loaders []map[string]int `json:"loaders"`
	}
	require.NoError(t, json.Unmarshal(data, &state))
	assert.Equal(t, 2, state.Format)
	require.Len(t, state.UserValues, 2)
	assert.Equal(t, "best", state.UserValues[0].Name)
	assert.Equal(t, []string{"user/000.bin"}, state.UserValues[0].Files)
	assert.True(t, state.UserValues[1].PerRank)
	assert.Equal(t, []string{"user/001-rank-0.bin", "user/001-rank-1.bin"}, state.UserValues[1].Files)
	assert.Equal(t, map[string]int{"epoch": 0, "consumed": 8, "batch_size": 2, "examples": 16}, state.Loaders[0])
}

// TestOptionalValueKeepsItsDefault: a value registered with OptionalState (added since the checkpoint was
// written, as a new field of a config) loads from a checkpoint that lacks it, keeping the program's value,
// while the saved values are restored; and a checkpoint that holds it restores it.
func TestOptionalValueKeepsItsDefault(t *testing.T) {
	dir := t.TempDir()
	saveWithValues(t, 1, dir, func(int) int64 { return 3 })
	acc := newSingle(t)
	var u userValues
	require.NoError(t, u.register(acc))
	patience := tally{n: 9}
	require.NoError(t, acc.RegisterForCheckpointing("patience", &patience, accel.OptionalState()))
	r := prepareResumable(t, acc, 8, 2, 1)
	require.NoError(t, acc.LoadState(dir))
	assert.Equal(t, int64(70), u.best.n, "saved values are restored")
	assert.Equal(t, int64(3), u.seen.n)
	assert.Equal(t, int64(9), patience.n, "the optional value keeps the program's value")
	assert.Positive(t, r.opt.Steps())

	// Saved now with it, it comes back.
	patience.n = 4
	_, err := acc.SaveState(dir)
	require.NoError(t, err)
	patience.n = 0
	require.NoError(t, acc.LoadState(dir))
	assert.Equal(t, int64(4), patience.n)
}
