package prepare_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/prepare"
)

// epochOrder is the epoch's permutation of 0..n-1, as one rank with batches of one example sees it.
func epochOrder(t *testing.T, n, epoch int, opts ...prepare.LoaderOption) []int {
	t.Helper()
	l := newLoaders(t, loaderRuntimes(t, 1, 1), rangeSource(t, n), append(slices.Clone(opts), prepare.BatchSize(1))...)[0]
	l.SetEpoch(epoch)
	var order []int
	for _, b := range epochBatches(t, l) {
		order = append(order, b.Indices...)
	}
	require.True(t, isPermutation(order, n))
	return order
}

// TestLoaderResumesOnAnyWorldSize: a loader's place saved by N ranks after m batches is the first N·m·b
// examples of the epoch's order; N' ranks restored there yield exactly the rest of the order, each real
// example once, with even batches padding or drop-last cutting the rest as a fresh epoch of that many
// examples would on N' ranks, the end of the dataloader on the last batch, the remainder of the rest, and
// the next epoch whole.
func TestLoaderResumesOnAnyWorldSize(t *testing.T) {
	const epoch, seed = 3, 5
	tests := []struct {
		name         string
		n            int
		from, to     int // world sizes
		b, bTo       int // per-rank batch sizes
		batches      int // consumed per rank before the save
		dropLast     bool
		unevenShards bool // even batches off
	}{
		{name: "1 to 2, same global batch", n: 40, from: 1, to: 2, b: 8, bTo: 4, batches: 2},
		{name: "2 to 4, same global batch", n: 40, from: 2, to: 4, b: 4, bTo: 2, batches: 3},
		{name: "4 to 2, same global batch", n: 40, from: 4, to: 2, b: 2, bTo: 4, batches: 1},
		{name: "2 to 1, same global batch", n: 40, from: 2, to: 1, b: 4, bTo: 8, batches: 4},
		{name: "2 to 3, tail padded for 3", n: 37, from: 2, to: 3, b: 3, bTo: 2, batches: 2},
		{name: "3 to 2, tail padded for 2", n: 29, from: 3, to: 2, b: 2, bTo: 3, batches: 3},
		{name: "2 to 4, the rest smaller than the world", n: 19, from: 2, to: 4, b: 4, bTo: 4, batches: 2},
		{name: "1 to 4, drop-last", n: 45, from: 1, to: 4, b: 4, bTo: 3, batches: 3, dropLast: true},
		{name: "4 to 1, drop-last", n: 45, from: 4, to: 1, b: 2, bTo: 5, batches: 2, dropLast: true},
		{name: "2 to 3, uneven shards", n: 31, from: 2, to: 3, b: 3, bTo: 2, batches: 2, unevenShards: true},
		{name: "same world, another batch size", n: 30, from: 2, to: 2, b: 3, bTo: 4, batches: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			common := []prepare.LoaderOption{prepare.Shuffle(), prepare.Seed(seed)}
			if tc.dropLast {
				common = append(common, prepare.DropLast())
			}
			if tc.unevenShards {
				common = append(common, prepare.EvenBatches(false))
			}
			order := epochOrder(t, tc.n, epoch, common...)

			// The saving run: N ranks, m batches each, then every rank's state.
			saving := newLoaders(t, loaderRuntimes(t, tc.from, 1), rangeSource(t, tc.n),
				append(slices.Clone(common), prepare.BatchSize(tc.b))...)
			var consumedBefore []int
			var state prepare.LoaderState
			for r, l := range saving {
				l.SetEpoch(epoch)
				ran := 0
				for batch, err := range l.All() {
					require.NoError(t, err)
					consumedBefore = append(consumedBefore, batch.Indices[:batch.Valid]...)
					if ran++; ran == tc.batches {
						break
					}
				}
				if r == 0 {
					state = l.State()
				}
				assert.Equal(t, state, l.State(), "rank %d: every rank is at the same place", r)
			}
			want := tc.from * tc.b * tc.batches
			require.Equal(t, prepare.LoaderState{Epoch: epoch, Consumed: want}, state)
			assert.ElementsMatch(t, order[:want], consumedBefore, "the consumed examples are the order's first N·m·b")

			// The resumed run: N' ranks.
			rts := loaderRuntimes(t, tc.to, 1)
			resumed := newLoaders(t, rts, rangeSource(t, tc.n), append(slices.Clone(common), prepare.BatchSize(tc.bTo))...)
			perRank := make([][]prepare.Batch, tc.to)
			var states []prepare.LoaderState
			var ends []bool
			for r, l := range resumed {
				require.NoError(t, l.Restore(state))
				l.SetEpoch(epoch)
				for batch, err := range l.All() {
					require.NoError(t, err)
					requireBatchMatchesIndices(t, batch)
					assert.Equal(t, epoch, batch.Epoch)
					if !tc.dropLast {
						assert.Equal(t, (tc.n-want)%(tc.to*tc.bTo), rts[r].State.Remainder(), "the rest's last round")
					}
					perRank[r] = append(perRank[r], batch)
					states = append(states, l.State())
					ends = append(ends, rts[r].State.EndOfDataloader())
				}
				if len(ends) > 0 {
					want := make([]bool, len(ends))
					want[len(want)-1] = true
					assert.Equal(t, want, ends, "rank %d: the end of the dataloader is the rest's last batch", r)
				}
				ends = ends[:0]
				for i, s := range states {
					wantState := prepare.LoaderState{Epoch: epoch, Consumed: want + (i+1)*tc.to*tc.bTo}
					if i == len(states)-1 {
						wantState = prepare.LoaderState{Epoch: epoch + 1}
					}
					assert.Equal(t, wantState, s, "rank %d after %d batches", r, i+1)
				}
				states = states[:0]
			}
			rest := tc.n - want
			used := rest
			if tc.dropLast {
				used = tc.to * tc.bTo * (rest / (tc.to * tc.bTo))
			}
			var realAfter []int
			for r, batches := range perRank {
				if !tc.unevenShards {
					assert.Len(t, batches, len(perRank[0]), "rank %d yields as many batches as rank 0", r)
				}
				for i, batch := range batches {
					realAfter = append(realAfter, batch.Indices[:batch.Valid]...)
					assert.Equal(t, batch.Valid, batch.ValidPerRank[r])
					if len(perRank[0]) > i {
						assert.Equal(t, perRank[0][i].ValidPerRank, batch.ValidPerRank, "rank %d step %d", r, i)
					}
				}
				if len(batches) > 0 && want%(tc.to*tc.bTo) == 0 {
					assert.Equal(t, want/(tc.to*tc.bTo), batches[0].Step, "steps continue the epoch's count")
				}
			}
			assert.ElementsMatch(t, order[want:want+used], realAfter,
				"the resumed ranks take the rest of the order, each real example once")
			assert.Len(t, realAfter, used)
			// Strided: the resumed rank r' takes positions Consumed + j·N' + r' of the order.
			for r, batches := range perRank {
				j := 0
				for _, batch := range batches {
					for _, idx := range batch.Indices[:batch.Valid] {
						assert.Equal(t, order[want+j*tc.to+r], idx, "rank %d, example %d of the rest", r, j)
						j++
					}
				}
			}
			for r, l := range resumed {
				assert.Equal(t, prepare.LoaderState{Epoch: epoch + 1}, l.State(),
					"rank %d: after the epoch's last batch the place is the next epoch's start", r)
				next := epochBatches(t, l)
				assert.Equal(t, epoch+1, l.Epoch())
				if !tc.unevenShards {
					assert.Len(t, next, l.Len(), "rank %d: the next epoch is whole", r)
				}
			}
		})
	}
}

// TestLoaderResumeAlignsSteps: with N'·b' = N·b the resumed ranks' batches are the ones a run of N' ranks
// that never stopped yields from the same step on: the same examples, the same steps, the same padding.
func TestLoaderResumeAlignsSteps(t *testing.T) {
	const n, epoch = 23, 1
	for _, tc := range []struct{ from, b, to, bTo, batches int }{
		{1, 4, 2, 2, 2}, {2, 2, 4, 1, 3}, {4, 1, 2, 2, 2}, {2, 2, 1, 4, 5},
	} {
		t.Run(fmt.Sprintf("%d×%d to %d×%d", tc.from, tc.b, tc.to, tc.bTo), func(t *testing.T) {
			opts := []prepare.LoaderOption{prepare.Shuffle(), prepare.Seed(2)}
			state := prepare.LoaderState{Epoch: epoch, Consumed: tc.from * tc.b * tc.batches}
			reference := newLoaders(t, loaderRuntimes(t, tc.to, 1), rangeSource(t, n), append(slices.Clone(opts), prepare.BatchSize(tc.bTo))...)
			resumed := newLoaders(t, loaderRuntimes(t, tc.to, 1), rangeSource(t, n), append(slices.Clone(opts), prepare.BatchSize(tc.bTo))...)
			for r := range tc.to {
				reference[r].SetEpoch(epoch)
				whole := epochBatches(t, reference[r])
				require.NoError(t, resumed[r].Restore(state))
				rest := epochBatches(t, resumed[r])
				skip := state.Consumed / (tc.to * tc.bTo)
				require.Len(t, rest, len(whole)-skip)
				for i, batch := range rest {
					want := whole[skip+i]
					assert.Equal(t, want.Indices, batch.Indices, "rank %d step %d", r, want.Step)
					assert.Equal(t, want.Step, batch.Step)
					assert.Equal(t, want.Valid, batch.Valid)
					assert.Equal(t, want.ValidPerRank, batch.ValidPerRank)
				}
			}
		})
	}
}

// TestLoaderEpochEndResumesAtNextEpoch: a state taken after the last batch of an epoch, with or without
// SetEpoch(epoch+1) before it, is the next epoch's start; a state whose epoch has nothing left on the
// restoring ranks (drop-last) restores to the next epoch too, so a resumed loop never runs an empty epoch.
func TestLoaderEpochEndResumesAtNextEpoch(t *testing.T) {
	l := newLoaders(t, loaderRuntimes(t, 2, 1), rangeSource(t, 10), prepare.BatchSize(2))[0]
	epochBatches(t, l)
	assert.Equal(t, prepare.LoaderState{Epoch: 1}, l.State(), "after the epoch, without SetEpoch")
	l.SetEpoch(1)
	assert.Equal(t, prepare.LoaderState{Epoch: 1}, l.State(), "after SetEpoch(epoch+1)")
	l.SetEpoch(0)
	assert.Equal(t, prepare.LoaderState{Epoch: 0}, l.State(), "SetEpoch to the finished epoch replays it")

	// 4 examples left of 21, on 3 ranks × 2 with drop-last: nothing fills a batch.
	dropping := newLoaders(t, loaderRuntimes(t, 3, 1), rangeSource(t, 21), prepare.BatchSize(2), prepare.DropLast())[0]
	require.NoError(t, dropping.Restore(prepare.LoaderState{Epoch: 2, Consumed: 17}))
	assert.Equal(t, prepare.LoaderState{Epoch: 3}, dropping.State())
	assert.Len(t, epochBatches(t, dropping), dropping.Len())
	assert.Equal(t, 3, dropping.Epoch())
}

// TestStreamLoaderResumesOnAnotherWorldSize: a stream's place counts its batches over every rank, so
// 2 ranks after 2 rounds (4 stream batches) resume on 3 ranks at stream batch 4.
func TestStreamLoaderResumesOnAnotherWorldSize(t *testing.T) {
	saving := loaderRuntimes(t, 2, 1)
	var state prepare.LoaderState
	for _, rt := range saving {
		l, err := prepare.NewStreamLoader(rt, newListDataset(11, 2, 0))
		require.NoError(t, err)
		ran := 0
		for _, err := range l.All() {
			require.NoError(t, err)
			if ran++; ran == 2 {
				break
			}
		}
		state = l.State()
	}
	require.Equal(t, prepare.LoaderState{Epoch: 0, Consumed: 4}, state)
	for r, rt := range loaderRuntimes(t, 3, 1) {
		l, err := prepare.NewStreamLoader(rt, newListDataset(11, 2, 0))
		require.NoError(t, err)
		require.NoError(t, l.Restore(state))
		var ids []int
		for batch, err := range l.All() {
			require.NoError(t, err)
			ids = append(ids, batchID(t, batch))
		}
		// Stream batches 4..10 in rounds of 3: {4,5,6} {7,8,9} {10, pad, pad}.
		assert.Equal(t, [][]int{{4, 7, 10}, {5, 8, 10}, {6, 9, 10}}[r], ids, "rank %d", r)
		assert.Equal(t, prepare.LoaderState{Epoch: 1}, l.State())
	}
}
