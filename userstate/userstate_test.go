package userstate_test

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/userstate"
)

// counter is a value for the tests: a decimal number. UnmarshalBinary refuses anything else.
type counter struct{ n int }

func (c *counter) MarshalBinary() ([]byte, error) { return []byte(strconv.Itoa(c.n)), nil }

func (c *counter) UnmarshalBinary(b []byte) error {
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return fmt.Errorf("counter: %w", err)
	}
	c.n = n
	return nil
}

// onRanks runs fn on every rank of an in-process group and returns each rank's error.
func onRanks(t *testing.T, size int, fn func(comm *backends.Communicator) error) []error {
	t.Helper()
	comms, err := backends.NewInProcessGroup(size)
	require.NoError(t, err)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() { errs[r] = fn(comms[r]) })
	}
	wg.Wait()
	return errs
}

// TestCollectGathersPerRankValues: values saved once come from every rank alike; per-rank values are
// gathered onto rank 0, by rank.
func TestCollectGathersPerRankValues(t *testing.T) {
	saved := make([]userstate.Saved, 3)
	errs := onRanks(t, 3, func(comm *backends.Communicator) error {
		var reg userstate.Registry
		require.NoError(t, reg.Register("epochs", &counter{7}))
		require.NoError(t, reg.Register("rank-sum", &counter{10 * comm.Rank()}, userstate.PerRank()))
		var err error
		saved[comm.Rank()], err = reg.Collect(comm)
		return err
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, userstate.Saved{Values: []userstate.SavedValue{
		{Name: "epochs", Data: [][]byte{[]byte("7")}},
		{Name: "rank-sum", PerRank: true, Data: [][]byte{[]byte("0"), []byte("10"), []byte("20")}},
	}}, saved[0])
	assert.Equal(t, userstate.Saved{Values: []userstate.SavedValue{
		{Name: "epochs", Data: [][]byte{[]byte("7")}},
		{Name: "rank-sum", PerRank: true},
	}}, saved[2], "other ranks know the names, not the others' bytes")
}

// TestCollectRefusesRanksThatDisagree: ranks that register different names, or a value saved once with
// different bytes, fail Collect on every rank with the same error; a value that cannot marshal is named.
func TestCollectRefusesRanksThatDisagree(t *testing.T) {
	for _, tc := range []struct {
		name     string
		register func(rank int, reg *userstate.Registry)
		want     string
	}{
		{"another name", func(rank int, reg *userstate.Registry) {
			_ = reg.Register([]string{"a", "b"}[rank], &counter{})
		}, `rank 0 has "a, saved once, bytes with sha256 5feceb66ffc86f38…"; rank 1 has "b, saved once`},
		{"different bytes", func(rank int, reg *userstate.Registry) {
			_ = reg.Register("a", &counter{rank})
		}, "a, saved once, bytes with sha256"},
		{"marshal fails", func(rank int, reg *userstate.Registry) {
			_ = reg.Register("broken", failing{})
		}, `value "broken": MarshalBinary: no bytes today`},
		{"marshal panics", func(rank int, reg *userstate.Registry) {
			_ = reg.Register("panicky", panicking{})
		}, `value "panicky": MarshalBinary panicked: boom`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := onRanks(t, 2, func(comm *backends.Communicator) error {
				var reg userstate.Registry
				tc.register(comm.Rank(), &reg)
				_, err := reg.Collect(comm)
				return err
			})
			for rank, err := range errs {
				require.Error(t, err, "rank %d", rank)
				assert.Contains(t, err.Error(), tc.want)
				assert.Equal(t, errs[0].Error(), err.Error())
			}
		})
	}
}

type failing struct{}

func (failing) MarshalBinary() ([]byte, error) { return nil, errors.New("no bytes today") }
func (failing) UnmarshalBinary([]byte) error   { return nil }

type panicking struct{}

func (panicking) MarshalBinary() ([]byte, error) { panic("boom") }
func (panicking) UnmarshalBinary([]byte) error   { panic("boom") }

// TestPlanChecksOnAFreshValue: Plan tries the bytes on a fresh value and changes nothing; refused bytes
// name the value.
func TestPlanChecksOnAFreshValue(t *testing.T) {
	var reg userstate.Registry
	c := &counter{5}
	require.NoError(t, reg.Register("c", c))
	_, err := reg.Plan(userstate.Saved{Values: []userstate.SavedValue{{Name: "c", Data: [][]byte{[]byte("x")}}}}, 0, 1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `value "c" refuses the checkpoint's bytes: counter:`)
	assert.Equal(t, 5, c.n)

	p, err := reg.Plan(userstate.Saved{Values: []userstate.SavedValue{{Name: "c", Data: [][]byte{[]byte("9")}}}}, 0, 1)
	require.NoError(t, err)
	assert.Equal(t, 5, c.n, "Plan changes nothing")
	require.NoError(t, p.Apply())
	assert.Equal(t, 9, c.n)
	require.NoError(t, p.Undo())
	assert.Equal(t, 5, c.n, "Undo sets the value back")
}

// TestOptionalValueMayBeMissing: a checkpoint without an Optional value plans without it (the value keeps
// the program's own); without Optional the same checkpoint is refused, naming the value and the option.
func TestOptionalValueMayBeMissing(t *testing.T) {
	saved := userstate.Saved{Values: []userstate.SavedValue{{Name: "a", Data: [][]byte{[]byte("3")}}}}
	var reg userstate.Registry
	a, added := &counter{}, &counter{7}
	require.NoError(t, reg.Register("a", a))
	require.NoError(t, reg.Register("added", added, userstate.Optional()))
	p, err := reg.Plan(saved, 0, 1)
	require.NoError(t, err)
	require.NoError(t, p.Apply())
	assert.Equal(t, 3, a.n)
	assert.Equal(t, 7, added.n, "the missing optional value keeps its own")

	var strict userstate.Registry
	require.NoError(t, strict.Register("a", &counter{}))
	require.NoError(t, strict.Register("added", &counter{}))
	_, err = strict.Plan(saved, 0, 1)
	assert.ErrorContains(t, err, `has no value "added"`)
	assert.ErrorContains(t, err, "Optional")
}

// TestPlanChecksScopeAndCopies: a per-process value on the saved number of ranks gives each rank its own;
// a value saved once with several copies, or a name twice, is refused.
func TestPlanChecksScopeAndCopies(t *testing.T) {
	var reg userstate.Registry
	c := &counter{}
	require.NoError(t, reg.Register("c", c, userstate.PerRank()))
	saved := userstate.Saved{Values: []userstate.SavedValue{{Name: "c", PerRank: true, Data: [][]byte{[]byte("1"), []byte("2")}}}}
	p, err := reg.Plan(saved, 1, 2)
	require.NoError(t, err)
	require.NoError(t, p.Apply())
	assert.Equal(t, 2, c.n)

	var once userstate.Registry
	require.NoError(t, once.Register("c", &counter{}))
	_, err = once.Plan(userstate.Saved{Values: []userstate.SavedValue{{Name: "c", Data: [][]byte{[]byte("1"), []byte("2")}}}}, 0, 1)
	assert.ErrorContains(t, err, `value "c" is saved once but the checkpoint has 2 copies`)
	_, err = once.Plan(userstate.Saved{Values: []userstate.SavedValue{{Name: "c", Data: [][]byte{[]byte("1")}},
		{Name: "c", Data: [][]byte{[]byte("1")}}}}, 0, 1)
	assert.ErrorContains(t, err, `holds value "c" twice`)
}

// TestApplySetsBackOnFailure: when a value refuses its bytes at Apply (a value whose UnmarshalBinary
// depends on more than the bytes), every value Apply set before it, and itself, are set back.
func TestApplySetsBackOnFailure(t *testing.T) {
	var reg userstate.Registry
	first := &counter{1}
	picky := &moody{n: 2}
	require.NoError(t, reg.Register("first", first))
	require.NoError(t, reg.Register("picky", picky))
	p, err := reg.Plan(userstate.Saved{Values: []userstate.SavedValue{
		{Name: "first", Data: [][]byte{[]byte("10")}},
		{Name: "picky", Data: [][]byte{[]byte("20")}},
	}}, 0, 1)
	require.NoError(t, err, "a fresh moody accepts the bytes")
	picky.refuse = true
	err = p.Apply()
	require.Error(t, err)
	assert.Contains(t, err.Error(), `value "picky" refused the checkpoint's bytes after accepting them on a fresh value`)
	assert.Equal(t, 1, first.n, "the value set before is set back")
	assert.Equal(t, 2, picky.n, "the value that refused is set back too")
}

// moody accepts bytes unless told to refuse: it breaks the contract on purpose. It half-sets its number
// before refusing, as careless code does.
type moody struct {
	n      int
	refuse bool
}

func (m *moody) MarshalBinary() ([]byte, error) { return []byte(strconv.Itoa(m.n)), nil }

func (m *moody) UnmarshalBinary(b []byte) error {
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return err
	}
	if m.refuse {
		m.n, m.refuse = -1, false // half-set, and accepts the setting back
		return errors.New("moody today")
	}
	m.n = n
	return nil
}

// TestResizeGivesBytesOnAnotherWorldSize: a Resize computes a rank's bytes from every saved rank's; its
// result is checked on a fresh value; its error names the value and both world sizes.
func TestResizeGivesBytesOnAnotherWorldSize(t *testing.T) {
	saved := userstate.Saved{Values: []userstate.SavedValue{{Name: "c", PerRank: true, Data: [][]byte{[]byte("1"), []byte("2")}}}}
	for _, tc := range []struct {
		name   string
		resize userstate.ResizeFunc
		want   int
		err    string
	}{
		{"last saved rank's", func(s [][]byte, rank, size int) ([]byte, error) { return s[len(s)-1], nil }, 2, ""},
		{"refused bytes", func([][]byte, int, int) ([]byte, error) { return []byte("x"), nil }, 0, `value "c" refuses`},
		{"error", func([][]byte, int, int) ([]byte, error) { return nil, errors.New("nope") }, 0,
			`value "c": resizing from 2 to 3 processes: nope`},
		{"panic", func([][]byte, int, int) ([]byte, error) { panic("bad") }, 0, "Resize panicked: bad"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reg userstate.Registry
			c := &counter{}
			require.NoError(t, reg.Register("c", c, userstate.PerRank(), userstate.Resize(tc.resize)))
			p, err := reg.Plan(saved, 2, 3)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.NoError(t, p.Apply())
			assert.Equal(t, tc.want, c.n)
		})
	}
}

// TestRegisterRefusesBadValues: a name is not empty nor registered twice, a value not nil, and Resize is
// for per-process values.
func TestRegisterRefusesBadValues(t *testing.T) {
	var reg userstate.Registry
	require.NoError(t, reg.Register("a", &counter{}))
	assert.ErrorContains(t, reg.Register("a", &counter{}), `"a" is registered already`)
	assert.ErrorContains(t, reg.Register("", &counter{}), "needs a name")
	assert.ErrorContains(t, reg.Register("nil", (*counter)(nil)), `"nil" is nil`)
	assert.ErrorContains(t, reg.Register("r", &counter{}, userstate.Resize(func([][]byte, int, int) ([]byte, error) { return nil, nil })),
		"has a Resize but is not PerRank")
	assert.Equal(t, []string{"a"}, reg.Names())
}
