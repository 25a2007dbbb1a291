package replicas_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/replicas"
)

// onRanks runs fn on every rank of an in-process group and returns each rank's error.
func onRanks(t *testing.T, size int, fn func(rank int, comm *backends.Communicator) error) []error {
	t.Helper()
	comms, err := backends.NewInProcessGroup(size, backends.WithTimeout(10*time.Second))
	require.NoError(t, err)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() { errs[r] = fn(r, comms[r]) })
	}
	wg.Wait()
	return errs
}

// sameOnEveryRank requires that every rank failed with the same message, and returns it.
func sameOnEveryRank(t *testing.T, errs []error) string {
	t.Helper()
	require.Error(t, errs[0])
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.Equal(t, errs[0].Error(), err.Error(), "every rank must say the same (rank %d)", r)
	}
	return errs[0].Error()
}

// TestMismatchesNameTheRightRanks: with 4 ranks, a mismatch is reported identically on every rank and
// names exactly the ranks that have each version.
func TestMismatchesNameTheRightRanks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string // per rank
		want   string
	}{
		{"last rank differs", []string{"a", "a", "a", "b"}, `ranks 0, 1 and 2 have "a"; rank 3 has "b"`},
		{"a middle rank differs", []string{"a", "a", "b", "a"}, `ranks 0, 1 and 3 have "a"; rank 2 has "b"`},
		{"two pairs", []string{"a", "b", "b", "a"}, `ranks 0 and 3 have "a"; ranks 1 and 2 have "b"`},
		{"rank 0 differs", []string{"b", "a", "a", "a"}, `rank 0 has "b"; ranks 1, 2 and 3 have "a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := onRanks(t, len(tc.values), func(rank int, comm *backends.Communicator) error {
				return replicas.CheckSameSignature(comm, "shapes", []string{"same", tc.values[rank], "after"})
			})
			msg := sameOnEveryRank(t, errs)
			assert.Equal(t, "replicas: shapes differ across ranks: "+tc.want, msg)
		})
	}
	t.Run("equal", func(t *testing.T) {
		errs := onRanks(t, 4, func(_ int, comm *backends.Communicator) error {
			return replicas.CheckSameSignature(comm, "shapes", []string{"same"})
		})
		for r, err := range errs {
			assert.NoError(t, err, "rank %d", r)
		}
	})
}

// TestCheckSameSettings: the error names the first setting the ranks disagree on and each rank's value.
func TestCheckSameSettings(t *testing.T) {
	settings := func(k, seed int) []replicas.Setting {
		return []replicas.Setting{{Name: "K", Value: fmt.Sprint(k)}, {Name: "seed", Value: fmt.Sprint(seed)}}
	}
	for _, tc := range []struct {
		name string
		per  func(rank int) []replicas.Setting
		want string
	}{
		{"same", func(int) []replicas.Setting { return settings(2, 1) }, ""},
		{"K on the last rank", func(rank int) []replicas.Setting { return settings(2+rank/3, 1) },
			"replicas: the ranks disagree on K: ranks 0, 1 and 2 have 2; rank 3 has 3"},
		{"seed per rank", func(rank int) []replicas.Setting { return settings(2, rank%2) },
			"replicas: the ranks disagree on seed: ranks 0 and 2 have 0; ranks 1 and 3 have 1"},
		{"a setting missing", func(rank int) []replicas.Setting { return settings(2, 1)[:1+min(rank, 1)] },
			"replicas: the ranks disagree on seed: rank 0 has nothing; ranks 1, 2 and 3 have 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := onRanks(t, 4, func(rank int, comm *backends.Communicator) error {
				return replicas.CheckSameSettings(comm, tc.per(rank))
			})
			if tc.want == "" {
				for r, err := range errs {
					assert.NoError(t, err, "rank %d", r)
				}
				return
			}
			assert.Equal(t, tc.want, sameOnEveryRank(t, errs))
		})
	}
}

// TestAgree: every rank gets nil only when every rank succeeded; otherwise the same error naming the
// failing ranks, grouped by reason, which still unwraps to the rank's own error.
func TestAgree(t *testing.T) {
	errDisk := errors.New("disk full")
	for _, tc := range []struct {
		name string
		per  func(rank int) error
		want string
	}{
		{"all succeed", func(int) error { return nil }, ""},
		{"one fails", func(rank int) error {
			if rank == 2 {
				return errDisk
			}
			return nil
		}, "saving: rank 2: disk full"},
		{"all fail alike", func(int) error { return errDisk }, "saving: every rank: disk full"},
		{"two reasons", func(rank int) error {
			if rank%2 == 1 {
				return fmt.Errorf("rank-specific %d", rank/2)
			}
			return nil
		}, "saving: rank 1: rank-specific 0; rank 3: rank-specific 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := onRanks(t, 4, func(rank int, comm *backends.Communicator) error {
				return replicas.Agree(comm, "saving", tc.per(rank))
			})
			if tc.want == "" {
				for r, err := range errs {
					assert.NoError(t, err, "rank %d", r)
				}
				return
			}
			assert.Equal(t, tc.want, sameOnEveryRank(t, errs))
			for r, err := range errs {
				assert.Equal(t, errors.Is(tc.per(r), errDisk), errors.Is(err, errDisk), "rank %d", r)
			}
		})
	}
}

func TestRankList(t *testing.T) {
	for _, tc := range []struct {
		ranks []int
		size  int
		want  string
	}{
		{[]int{3}, 4, "rank 3"},
		{[]int{0, 3}, 4, "ranks 0 and 3"},
		{[]int{0, 1, 3}, 4, "ranks 0, 1 and 3"},
		{[]int{0, 1, 2, 3}, 4, "every rank"},
		{[]int{0, 1}, 0, "ranks 0 and 1"},
	} {
		assert.Equal(t, tc.want, replicas.RankList(tc.ranks, tc.size))
	}
}
