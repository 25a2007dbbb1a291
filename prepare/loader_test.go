package prepare_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	gomlxbackends "github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	_ "github.com/goaccel/goaccel/cpu/kernels" // goaccel's kernels, as accel links them
	"github.com/goaccel/goaccel/prepare"
)

var (
	loaderBackendOnce sync.Once
	loaderBackend     gomlxbackends.Backend
	loaderBackendErr  error
)

// loaderRuntimes returns one Runtime per rank of an in-process group of the given size, each with its own
// gradient state (K micro-batches per step). The data loader does no collectives, so the ranks' loaders
// can all be driven from the test's goroutine.
func loaderRuntimes(t *testing.T, ranks, k int) []*prepare.Runtime {
	t.Helper()
	loaderBackendOnce.Do(func() {
		loaderBackend, loaderBackendErr = cpu.New(cpu.Config{Backend: "go"})
	})
	require.NoError(t, loaderBackendErr)
	comms, err := backends.NewInProcessGroup(ranks)
	require.NoError(t, err)
	rts := make([]*prepare.Runtime, ranks)
	for r, comm := range comms {
		state, err := accumulate.NewGradientState(k, false)
		require.NoError(t, err)
		rts[r] = &prepare.Runtime{Backend: loaderBackend, Comm: comm, State: state}
	}
	t.Cleanup(func() {
		for r, rt := range rts {
			assert.Zero(t, rt.Comm.Stats().Calls(), "rank %d: the data loader must not communicate", r)
			assert.NoError(t, rt.Comm.Close())
		}
	})
	return rts
}

// rangeSource is a TensorSource of n examples whose input is the example's index (int32) and whose label
// is ten times it (float32), so that a batch's content can be checked against its Indices.
func rangeSource(t *testing.T, n int) prepare.Source {
	t.Helper()
	inputs := make([]int32, n)
	labels := make([]float32, n)
	for i := range n {
		inputs[i], labels[i] = int32(i), float32(10*i)
	}
	src, err := prepare.TensorSource([]*tensors.Tensor{tensors.FromFlatDataAndDimensions(inputs, n)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(labels, n)})
	require.NoError(t, err)
	return src
}

// newLoaders builds one loader per rank over the same source and options.
func newLoaders(t *testing.T, rts []*prepare.Runtime, src prepare.Source, opts ...prepare.LoaderOption) []*prepare.DataLoader {
	t.Helper()
	loaders := make([]*prepare.DataLoader, len(rts))
	for r, rt := range rts {
		l, err := prepare.NewDataLoader(rt, src, opts...)
		require.NoError(t, err, "rank %d", r)
		loaders[r] = l
	}
	return loaders
}

// epochBatches iterates l once and checks each batch's tensors against its indices.
func epochBatches(t *testing.T, l *prepare.DataLoader) []prepare.Batch {
	t.Helper()
	var out []prepare.Batch
	for batch, err := range l.All() {
		require.NoError(t, err)
		requireBatchMatchesIndices(t, batch)
		out = append(out, batch)
	}
	return out
}

func requireBatchMatchesIndices(t *testing.T, batch prepare.Batch) {
	t.Helper()
	require.Len(t, batch.Inputs, 1)
	require.Len(t, batch.Labels, 1)
	wantIn := make([]int32, len(batch.Indices))
	wantLabels := make([]float32, len(batch.Indices))
	for i, idx := range batch.Indices {
		wantIn[i], wantLabels[i] = int32(idx), float32(10*idx)
	}
	require.Equal(t, wantIn, tensors.MustCopyFlatData[int32](batch.Inputs[0]), "inputs of step %d", batch.Step)
	require.Equal(t, wantLabels, tensors.MustCopyFlatData[float32](batch.Labels[0]), "labels of step %d", batch.Step)
	require.Equal(t, len(batch.Indices), batch.Size())
}

// allRanksEpoch iterates every rank's loader once and returns the batches per rank.
func allRanksEpoch(t *testing.T, loaders []*prepare.DataLoader) [][]prepare.Batch {
	t.Helper()
	out := make([][]prepare.Batch, len(loaders))
	for r, l := range loaders {
		out[r] = epochBatches(t, l)
	}
	return out
}

// indicesOf lists a rank's batches' indices.
func indicesOf(batches []prepare.Batch) [][]int {
	out := make([][]int, len(batches))
	for i, b := range batches {
		out[i] = b.Indices
	}
	return out
}

// globalOrder rebuilds the epoch's global order from the ranks' batches: rank r's j-th example of the
// epoch sits at position j·N + r. It requires every rank to have yielded the same number of examples.
func globalOrder(t *testing.T, perRank [][]prepare.Batch) []int {
	t.Helper()
	size := len(perRank)
	var shards [][]int
	for _, batches := range perRank {
		var shard []int
		for _, b := range batches {
			shard = append(shard, b.Indices...)
		}
		shards = append(shards, shard)
	}
	for r := range shards {
		require.Len(t, shards[r], len(shards[0]), "rank %d's shard length", r)
	}
	order := make([]int, size*len(shards[0]))
	for r, shard := range shards {
		for j, idx := range shard {
			order[j*size+r] = idx
		}
	}
	return order
}

// realExamples lists every rank's non-padding examples of an epoch.
func realExamples(perRank [][]prepare.Batch) []int {
	var out []int
	for _, batches := range perRank {
		for _, b := range batches {
			out = append(out, b.Indices[:b.Valid]...)
		}
	}
	slices.Sort(out)
	return out
}

func identity(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func isPermutation(order []int, n int) bool {
	sorted := slices.Sorted(slices.Values(order))
	return slices.Equal(sorted, identity(n))
}

func TestLoaderShuffle(t *testing.T) {
	const n, size, b = 24, 3, 4
	epoch := func(seed uint64, ep int, ranks int, shuffle bool) []int {
		opts := []prepare.LoaderOption{prepare.BatchSize(b), prepare.Seed(seed)}
		if shuffle {
			opts = append(opts, prepare.Shuffle())
		}
		loaders := newLoaders(t, loaderRuntimes(t, ranks, 1), rangeSource(t, n), opts...)
		for _, l := range loaders {
			l.SetEpoch(ep)
		}
		return globalOrder(t, allRanksEpoch(t, loaders))
	}
	base := epoch(7, 0, size, true)
	require.True(t, isPermutation(base, n), "the union of the ranks' shards must be a permutation: %v", base)
	assert.NotEqual(t, identity(n), base, "shuffled")
	assert.Equal(t, base, epoch(7, 0, size, true), "same seed and epoch: same order")
	assert.Equal(t, base, epoch(7, 0, 1, true), "the order does not depend on the world size")
	assert.Equal(t, base, epoch(7, 0, 2, true), "the order does not depend on the world size")
	other := map[string][]int{
		"epoch 1": epoch(7, 1, size, true),
		"epoch 2": epoch(7, 2, size, true),
		"seed 8":  epoch(8, 0, size, true),
	}
	for what, order := range other {
		assert.True(t, isPermutation(order, n), what)
		assert.NotEqual(t, base, order, "%s must shuffle differently", what)
	}
	assert.NotEqual(t, other["epoch 1"], other["epoch 2"])
	assert.Equal(t, identity(n), epoch(7, 3, size, false), "without Shuffle the order is the dataset's")
}

// TestLoaderDivisible: when N divides n the shards are disjoint, cover every example once per epoch, and
// nothing is padding.
func TestLoaderDivisible(t *testing.T) {
	tests := []struct{ n, size, b int }{
		{12, 3, 2}, {12, 4, 3}, {8, 2, 4}, {6, 1, 6}, {6, 1, 4}, {9, 3, 2}, {5, 5, 1},
	}
	for _, tc := range tests {
		for _, shuffle := range []bool{false, true} {
			t.Run(fmt.Sprintf("n=%d,N=%d,b=%d,shuffle=%v", tc.n, tc.size, tc.b, shuffle), func(t *testing.T) {
				opts := []prepare.LoaderOption{prepare.BatchSize(tc.b), prepare.Seed(5)}
				if shuffle {
					opts = append(opts, prepare.Shuffle())
				}
				loaders := newLoaders(t, loaderRuntimes(t, tc.size, 1), rangeSource(t, tc.n), opts...)
				for ep := range 2 {
					perRank := allRanksEpoch(t, loaders)
					shardLen := tc.n / tc.size
					wantBatches := (shardLen + tc.b - 1) / tc.b
					for r, batches := range perRank {
						require.Len(t, batches, wantBatches, "rank %d", r)
						assert.Equal(t, wantBatches, loaders[r].Len())
						for step, batch := range batches {
							wantSize := min(tc.b, shardLen-step*tc.b)
							assert.Equal(t, ep, batch.Epoch)
							assert.Equal(t, step, batch.Step)
							assert.Equal(t, wantSize, batch.Size())
							assert.Equal(t, wantSize, batch.Valid, "nothing is padding")
							assert.Equal(t, slices.Repeat([]int{wantSize}, tc.size), batch.ValidPerRank)
						}
					}
					order := globalOrder(t, perRank)
					assert.Len(t, order, tc.n)
					assert.True(t, isPermutation(order, tc.n), "epoch %d: every example exactly once: %v", ep, order)
					if !shuffle {
						assert.Equal(t, identity(tc.n), order, "rank r takes every N-th example")
					}
				}
			})
		}
	}
}

// TestLoaderUnevenExplicit spells out a small uneven case: 10 examples, 3 ranks, batch size 2.
func TestLoaderUnevenExplicit(t *testing.T) {
	tests := []struct {
		name          string
		opts          []prepare.LoaderOption
		want          [][][]int // rank → batches → indices
		wantValid     [][]int   // rank → batches → Valid
		wantValidRank [][]int   // step → ValidPerRank
	}{
		{
			name:          "even batches (default)",
			want:          [][][]int{{{0, 3}, {6, 9}}, {{1, 4}, {7, 0}}, {{2, 5}, {8, 1}}},
			wantValid:     [][]int{{2, 2}, {2, 1}, {2, 1}},
			wantValidRank: [][]int{{2, 2, 2}, {2, 1, 1}},
		},
		{
			name:          "drop last",
			opts:          []prepare.LoaderOption{prepare.DropLast()},
			want:          [][][]int{{{0, 3}}, {{1, 4}}, {{2, 5}}},
			wantValid:     [][]int{{2}, {2}, {2}},
			wantValidRank: [][]int{{2, 2, 2}},
		},
		{
			name:          "uneven shards",
			opts:          []prepare.LoaderOption{prepare.EvenBatches(false)},
			want:          [][][]int{{{0, 3}, {6, 9}}, {{1, 4}, {7}}, {{2, 5}, {8}}},
			wantValid:     [][]int{{2, 2}, {2, 1}, {2, 1}},
			wantValidRank: [][]int{{2, 2, 2}, {2, 1, 1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			loaders := newLoaders(t, loaderRuntimes(t, 3, 1), rangeSource(t, 10), append(tc.opts, prepare.BatchSize(2))...)
			perRank := allRanksEpoch(t, loaders)
			for r, batches := range perRank {
				assert.Equal(t, tc.want[r], indicesOf(batches), "rank %d", r)
				assert.Equal(t, len(tc.want[r]), loaders[r].Len(), "rank %d", r)
				valid := make([]int, len(batches))
				for i, b := range batches {
					valid[i] = b.Valid
					assert.Equal(t, tc.wantValidRank[i], b.ValidPerRank, "rank %d step %d", r, i)
				}
				assert.Equal(t, tc.wantValid[r], valid, "rank %d", r)
			}
		})
	}
}

// TestLoaderEvenBatchesPadding: N does not divide n. Every rank yields the same number of batches of the
// same sizes; the padding repeats the epoch's first examples; Valid counts exactly the real ones.
func TestLoaderEvenBatchesPadding(t *testing.T) {
	tests := []struct{ n, size, b int }{
		{10, 3, 2}, {10, 4, 3}, {7, 3, 5}, {2, 4, 1}, {2, 4, 3}, {11, 2, 4}, {13, 5, 2}, {1, 3, 2},
	}
	for _, tc := range tests {
		for _, shuffle := range []bool{false, true} {
			t.Run(fmt.Sprintf("n=%d,N=%d,b=%d,shuffle=%v", tc.n, tc.size, tc.b, shuffle), func(t *testing.T) {
				require.NotZero(t, tc.n%tc.size, "the case must be uneven")
				opts := []prepare.LoaderOption{prepare.BatchSize(tc.b), prepare.Seed(11)}
				if shuffle {
					opts = append(opts, prepare.Shuffle())
				}
				loaders := newLoaders(t, loaderRuntimes(t, tc.size, 1), rangeSource(t, tc.n), opts...)
				perRank := allRanksEpoch(t, loaders)

				shardLen := (tc.n + tc.size - 1) / tc.size
				wantBatches := (shardLen + tc.b - 1) / tc.b
				totalValid := 0
				for r, batches := range perRank {
					require.Len(t, batches, wantBatches, "rank %d", r)
					assert.Equal(t, wantBatches, loaders[r].Len(), "rank %d", r)
					for step, batch := range batches {
						assert.Equal(t, min(tc.b, shardLen-step*tc.b), batch.Size(), "rank %d step %d", r, step)
						assert.Equal(t, perRank[0][step].ValidPerRank, batch.ValidPerRank, "every rank agrees")
						require.Len(t, batch.ValidPerRank, tc.size)
						assert.Equal(t, batch.Valid, batch.ValidPerRank[r])
						totalValid += batch.Valid
					}
				}
				assert.Equal(t, tc.n, totalValid, "summing Valid across ranks counts every example once")
				assert.Equal(t, identity(tc.n), realExamples(perRank), "the real examples cover the dataset once")

				order := globalOrder(t, perRank)
				require.Len(t, order, shardLen*tc.size)
				assert.True(t, isPermutation(order[:tc.n], tc.n), "the first n positions are the epoch's permutation")
				for p := tc.n; p < len(order); p++ {
					assert.Equal(t, order[(p-tc.n)%tc.n], order[p], "padding position %d repeats from the start", p)
				}
				// Padding is trailing: Valid is the number of leading real examples.
				for r, batches := range perRank {
					for step, batch := range batches {
						for j := range batch.Size() {
							p := (step*tc.b+j)*tc.size + r
							assert.Equal(t, p < tc.n, j < batch.Valid, "rank %d step %d example %d", r, step, j)
						}
					}
				}
			})
		}
	}
}

func TestLoaderDropLast(t *testing.T) {
	tests := []struct{ n, size, b int }{
		{10, 3, 2}, {10, 3, 3}, {10, 4, 2}, {23, 2, 5}, {12, 3, 4}, {7, 1, 3},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("n=%d,N=%d,b=%d", tc.n, tc.size, tc.b), func(t *testing.T) {
			loaders := newLoaders(t, loaderRuntimes(t, tc.size, 1), rangeSource(t, tc.n),
				prepare.BatchSize(tc.b), prepare.DropLast(), prepare.Shuffle(), prepare.Seed(2))
			perRank := allRanksEpoch(t, loaders)
			wantBatches := tc.n / tc.size / tc.b
			var all []int
			for r, batches := range perRank {
				require.Len(t, batches, wantBatches, "rank %d", r)
				assert.Equal(t, wantBatches, loaders[r].Len())
				for _, batch := range batches {
					assert.Equal(t, tc.b, batch.Size(), "every batch is full")
					assert.Equal(t, tc.b, batch.Valid)
					assert.Equal(t, slices.Repeat([]int{tc.b}, tc.size), batch.ValidPerRank)
					all = append(all, batch.Indices...)
				}
			}
			assert.Len(t, all, wantBatches*tc.b*tc.size)
			slices.Sort(all)
			assert.Len(t, slices.Compact(all), wantBatches*tc.b*tc.size, "no example is repeated")
		})
	}
}

func TestLoaderUnevenShards(t *testing.T) {
	tests := []struct{ n, size, b int }{
		{10, 3, 2}, {10, 4, 1}, {10, 4, 3}, {7, 3, 5}, {2, 4, 1}, {13, 5, 2},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("n=%d,N=%d,b=%d", tc.n, tc.size, tc.b), func(t *testing.T) {
			loaders := newLoaders(t, loaderRuntimes(t, tc.size, 1), rangeSource(t, tc.n),
				prepare.BatchSize(tc.b), prepare.EvenBatches(false), prepare.Shuffle(), prepare.Seed(4))
			perRank := allRanksEpoch(t, loaders)
			shardLens := make([]int, tc.size)
			var all []int
			for r, batches := range perRank {
				assert.Equal(t, len(batches), loaders[r].Len(), "rank %d", r)
				for _, batch := range batches {
					assert.Equal(t, batch.Size(), batch.Valid, "no padding")
					shardLens[r] += batch.Size()
					all = append(all, batch.Indices...)
				}
			}
			assert.LessOrEqual(t, slices.Max(shardLens)-slices.Min(shardLens), 1, "shards differ by at most one: %v", shardLens)
			slices.Sort(all)
			assert.Equal(t, identity(tc.n), all, "every example exactly once")

			// ValidPerRank describes every rank's batch of that step, as that rank yields it.
			for r, batches := range perRank {
				for step, batch := range batches {
					want := make([]int, tc.size)
					for other := range tc.size {
						if step < len(perRank[other]) {
							want[other] = perRank[other][step].Valid
						}
					}
					assert.Equal(t, want, batch.ValidPerRank, "rank %d step %d", r, step)
				}
			}
		})
	}
}

func TestNewDataLoaderErrors(t *testing.T) {
	rts := loaderRuntimes(t, 3, 1)
	tests := []struct {
		name         string
		rt           *prepare.Runtime
		src          prepare.Source
		opts         []prepare.LoaderOption
		wantContains []string
	}{
		{name: "batch larger than the shard with drop-last", rt: rts[0], src: rangeSource(t, 10),
			opts:         []prepare.LoaderOption{prepare.BatchSize(4), prepare.DropLast()},
			wantContains: []string{"batch size 4", "3 examples", "3 rank"}},
		{name: "fewer examples than ranks with drop-last", rt: rts[1], src: rangeSource(t, 2),
			opts:         []prepare.LoaderOption{prepare.DropLast()},
			wantContains: []string{"batch size 1", "0 examples", "3 rank"}},
		{name: "empty dataset", rt: rts[0], src: rangeSource(t, 0), wantContains: []string{"empty"}},
		{name: "batch size zero", rt: rts[0], src: rangeSource(t, 10), opts: []prepare.LoaderOption{prepare.BatchSize(0)},
			wantContains: []string{"at least 1", "0"}},
		{name: "negative batch size", rt: rts[0], src: rangeSource(t, 10), opts: []prepare.LoaderOption{prepare.BatchSize(-2)},
			wantContains: []string{"at least 1", "-2"}},
		{name: "nil source", rt: rts[0], src: nil, wantContains: []string{"nil"}},
		{name: "nil runtime", rt: nil, src: rangeSource(t, 10), wantContains: []string{"runtime"}},
		{name: "runtime without state", rt: &prepare.Runtime{Backend: rts[0].Backend, Comm: rts[0].Comm},
			src: rangeSource(t, 10), wantContains: []string{"gradient state"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := prepare.NewDataLoader(tc.rt, tc.src, tc.opts...)
			require.Error(t, err)
			assert.Nil(t, l)
			for _, s := range tc.wantContains {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
	// The boundary: a batch exactly as large as the shard is fine.
	l, err := prepare.NewDataLoader(rts[0], rangeSource(t, 10), prepare.BatchSize(3), prepare.DropLast())
	require.NoError(t, err)
	assert.Equal(t, 1, l.Len())
	assert.Equal(t, 3, l.BatchSize())
}

func TestLoaderEpochs(t *testing.T) {
	const n, size, b = 12, 2, 3
	opts := []prepare.LoaderOption{prepare.BatchSize(b), prepare.Shuffle(), prepare.Seed(21)}
	// reference is every rank's indices of an epoch, from fresh loaders told the epoch explicitly.
	reference := func(ep int) [][][]int {
		loaders := newLoaders(t, loaderRuntimes(t, size, 1), rangeSource(t, n), opts...)
		out := make([][][]int, size)
		for r, l := range loaders {
			l.SetEpoch(ep)
			out[r] = indicesOf(epochBatches(t, l))
		}
		return out
	}
	run := func(loaders []*prepare.DataLoader) (int, [][][]int) {
		out := make([][][]int, size)
		ep := -1
		for r, l := range loaders {
			batches := epochBatches(t, l)
			for _, batch := range batches {
				assert.Equal(t, l.Epoch(), batch.Epoch)
			}
			ep = l.Epoch()
			out[r] = indicesOf(batches)
		}
		return ep, out
	}
	ref := map[int][][][]int{0: reference(0), 1: reference(1), 2: reference(2), 5: reference(5), 6: reference(6)}
	assert.NotEqual(t, ref[0], ref[1])

	loaders := newLoaders(t, loaderRuntimes(t, size, 1), rangeSource(t, n), opts...)
	steps := []struct {
		setEpoch  int // -1: no SetEpoch before iterating
		wantEpoch int
	}{
		{-1, 0}, // the first iteration is epoch 0
		{-1, 1}, // iterated again without SetEpoch: the next epoch
		{-1, 2},
		{0, 0}, // SetEpoch goes back
		{0, 0}, // and SetEpoch with the same epoch repeats it
		{5, 5},
		{-1, 6},
	}
	for i, step := range steps {
		if step.setEpoch >= 0 {
			for _, l := range loaders {
				l.SetEpoch(step.setEpoch)
			}
		}
		ep, got := run(loaders)
		assert.Equal(t, step.wantEpoch, ep, "iteration %d", i)
		assert.Equal(t, ref[step.wantEpoch], got, "iteration %d must yield epoch %d's order", i, step.wantEpoch)
	}
}

func TestLoaderRestore(t *testing.T) {
	const n, size, b = 14, 2, 2 // 7 examples per rank: 4 batches, the last one of a single example
	opts := []prepare.LoaderOption{prepare.BatchSize(b), prepare.Shuffle(), prepare.Seed(3)}
	reference := func(ep int) [][]prepare.Batch {
		loaders := newLoaders(t, loaderRuntimes(t, size, 1), rangeSource(t, n), opts...)
		for _, l := range loaders {
			l.SetEpoch(ep)
		}
		return allRanksEpoch(t, loaders)
	}
	ref2, ref3 := reference(2), reference(3)
	require.Len(t, ref2[0], 4)

	for position := 0; position <= 4; position++ {
		t.Run(fmt.Sprintf("position %d", position), func(t *testing.T) {
			rts := loaderRuntimes(t, size, 1)
			loaders := newLoaders(t, rts, rangeSource(t, n), opts...)
			for r, l := range loaders {
				// position batches of 2 ranks × 2 examples: the first 4·position examples of the order.
				state, err := l.StateAfterBatches(2, position)
				require.NoError(t, err)
				require.NoError(t, l.Restore(state))
				if position == 4 {
					// The whole epoch was consumed: the next iteration is epoch 3, not an empty epoch 2.
					assert.Equal(t, prepare.LoaderState{Epoch: 3}, state)
					assert.Equal(t, 3, l.Epoch())
					assert.Zero(t, l.Position())
					assert.Equal(t, indicesOf(ref3[r]), indicesOf(epochBatches(t, l)), "rank %d", r)
					continue
				}
				assert.Equal(t, prepare.LoaderState{Epoch: 2, Consumed: size * b * position}, state)
				assert.Equal(t, position, l.Position())
				assert.Equal(t, 2, l.Epoch())
				l.SetEpoch(2) // the usual loop calls SetEpoch with the restored epoch: it keeps the position
				var got []prepare.Batch
				for batch, err := range l.All() {
					require.NoError(t, err)
					assert.Equal(t, batch.Step+1, l.Position())
					assert.Equal(t, batch.Step == 3, rts[r].State.EndOfDataloader(), "step %d", batch.Step)
					got = append(got, batch)
				}
				assert.Equal(t, indicesOf(ref2[r][position:]), indicesOf(got), "rank %d resumes at batch %d", r, position)
				for i, batch := range got {
					assert.Equal(t, 2, batch.Epoch)
					assert.Equal(t, position+i, batch.Step)
					assert.Equal(t, ref2[r][position+i].Valid, batch.Valid)
					assert.Equal(t, ref2[r][position+i].ValidPerRank, batch.ValidPerRank)
				}
				assert.False(t, rts[r].State.EndOfDataloader())
				// The next iteration is a whole epoch 3.
				assert.Equal(t, indicesOf(ref3[r]), indicesOf(epochBatches(t, l)), "rank %d", r)
				assert.Equal(t, 3, l.Epoch())
			}
		})
	}

	t.Run("SetEpoch to another epoch forgets the position", func(t *testing.T) {
		loaders := newLoaders(t, loaderRuntimes(t, size, 1), rangeSource(t, n), opts...)
		for r, l := range loaders {
			require.NoError(t, l.Restore(prepare.LoaderState{Epoch: 2, Consumed: 12}))
			l.SetEpoch(3)
			assert.Equal(t, indicesOf(ref3[r]), indicesOf(epochBatches(t, l)))
		}
	})

	t.Run("out of range", func(t *testing.T) {
		l := newLoaders(t, loaderRuntimes(t, 1, 1), rangeSource(t, n), opts...)[0]
		for _, consumed := range []int{-1, n + 1, 100} {
			err := l.Restore(prepare.LoaderState{Epoch: 1, Consumed: consumed})
			require.Error(t, err, "consumed %d", consumed)
			assert.Contains(t, err.Error(), fmt.Sprint(consumed))
		}
		for _, batches := range []int{-1, l.Len() + 1} {
			_, err := l.StateAfterBatches(1, batches)
			require.Error(t, err, "batches %d", batches)
			assert.Contains(t, err.Error(), fmt.Sprint(batches))
		}
		require.Error(t, l.Restore(prepare.LoaderState{Epoch: -1}))
		assert.Zero(t, l.Epoch(), "a rejected Restore changes nothing")
		assert.Len(t, epochBatches(t, l), l.Len(), "a rejected Restore changes nothing")
	})
}

func TestLoaderPeekBatch(t *testing.T) {
	const n, size, b = 11, 3, 2
	rts := loaderRuntimes(t, size, 1)
	loaders := newLoaders(t, rts, rangeSource(t, n), prepare.BatchSize(b), prepare.Shuffle(), prepare.Seed(8))
	requirePeekIsNext := func(t *testing.T, l *prepare.DataLoader, what string) {
		t.Helper()
		peeked, err := l.PeekBatch()
		require.NoError(t, err)
		requireBatchMatchesIndices(t, peeked)
		again, err := l.PeekBatch()
		require.NoError(t, err)
		assert.Equal(t, peeked.Indices, again.Indices, "%s: peeking twice gives the same batch", what)
		var first prepare.Batch
		for batch, err := range l.All() {
			require.NoError(t, err)
			first = batch
			break
		}
		assert.Equal(t, first.Indices, peeked.Indices, what)
		assert.Equal(t, first.Epoch, peeked.Epoch, what)
		assert.Equal(t, first.Step, peeked.Step, what)
		assert.Equal(t, first.Valid, peeked.Valid, what)
		assert.Equal(t, first.ValidPerRank, peeked.ValidPerRank, what)
		assert.Equal(t, tensors.MustCopyFlatData[int32](first.Inputs[0]), tensors.MustCopyFlatData[int32](peeked.Inputs[0]), what)
	}
	for r, l := range loaders {
		requirePeekIsNext(t, l, fmt.Sprintf("rank %d, fresh", r))
		requirePeekIsNext(t, l, fmt.Sprintf("rank %d, after an iteration (next epoch)", r))
		l.SetEpoch(7)
		requirePeekIsNext(t, l, fmt.Sprintf("rank %d, after SetEpoch", r))
		require.NoError(t, l.Restore(prepare.LoaderState{Epoch: 4, Consumed: size * b}))
		requirePeekIsNext(t, l, fmt.Sprintf("rank %d, after Restore", r))
		require.NoError(t, l.Restore(prepare.LoaderState{Epoch: 4, Consumed: 5}))
		requirePeekIsNext(t, l, fmt.Sprintf("rank %d, after Restore inside a batch of this run", r))
	}

	t.Run("restored at the end of an epoch", func(t *testing.T) {
		l := loaders[0]
		require.NoError(t, l.Restore(prepare.LoaderState{Epoch: 4, Consumed: n}))
		peeked, err := l.PeekBatch()
		require.NoError(t, err, "a model can still be built from a loader restored at the end of an epoch")
		assert.Equal(t, 5, peeked.Epoch, "an epoch consumed whole resumes at the next one")
		assert.Equal(t, 0, peeked.Step)
		assert.NotEmpty(t, peeked.Indices)
	})
}

// TestLoaderEndOfDataloader: the gradient state knows while the last batch is processed, and only then.
func TestLoaderEndOfDataloader(t *testing.T) {
	tests := []struct {
		name    string
		n, b    int
		breakAt int // -1: do not break
	}{
		{name: "whole epoch", n: 10, b: 3, breakAt: -1},
		{name: "single batch", n: 3, b: 3, breakAt: -1},
		{name: "break early", n: 10, b: 3, breakAt: 0},
		{name: "break in the middle", n: 10, b: 3, breakAt: 2},
		{name: "break at the last batch", n: 10, b: 3, breakAt: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := loaderRuntimes(t, 1, 1)[0]
			l := newLoaders(t, []*prepare.Runtime{rt}, rangeSource(t, tc.n), prepare.BatchSize(tc.b))[0]
			assert.False(t, rt.State.EndOfDataloader(), "before the loop")
			var flags []bool
			for batch, err := range l.All() {
				require.NoError(t, err)
				flags = append(flags, rt.State.EndOfDataloader())
				if batch.Step == tc.breakAt {
					break
				}
			}
			assert.False(t, rt.State.EndOfDataloader(), "after the loop, broken out of or not")
			want := make([]bool, l.Len())
			want[len(want)-1] = true
			if tc.breakAt >= 0 {
				want = want[:tc.breakAt+1]
			}
			assert.Equal(t, want, flags)
		})
	}
}

// TestLoaderDrivesAccumulate: K=4 over a loader of 6 batches syncs on the 4th and the 6th batch.
func TestLoaderDrivesAccumulate(t *testing.T) {
	rts := loaderRuntimes(t, 2, 4)
	loaders := newLoaders(t, rts, rangeSource(t, 23), prepare.BatchSize(2)) // 12 per rank with padding: 6 batches
	for r, l := range loaders {
		state := rts[r].State
		for range 2 { // the pattern repeats in the next epoch: the short cycle does not leak into it
			var synced []int
			for batch, err := range l.All() {
				require.NoError(t, err)
				require.NoError(t, state.Accumulate(func() error {
					if state.SyncGradients() {
						synced = append(synced, batch.Step+1)
					}
					return nil
				}))
			}
			assert.Equal(t, []int{4, 6}, synced, "rank %d", r)
		}
	}
}

func TestLoaderIteratingWhileIterating(t *testing.T) {
	rt := loaderRuntimes(t, 1, 1)[0]
	l := newLoaders(t, []*prepare.Runtime{rt}, rangeSource(t, 6), prepare.BatchSize(2))[0]
	outer := 0
	for batch, err := range l.All() {
		require.NoError(t, err)
		outer++
		if batch.Step != 1 {
			continue
		}
		inner := 0
		for _, err := range l.All() {
			inner++
			require.Error(t, err)
			assert.Contains(t, err.Error(), "already iterating")
		}
		assert.Equal(t, 1, inner, "the nested iteration yields only its error")
		assert.Equal(t, 2, l.Position(), "the nested iteration must not disturb the outer one")
		assert.False(t, rt.State.EndOfDataloader())
	}
	assert.Equal(t, 3, outer, "the outer iteration goes on")
	assert.Equal(t, 0, l.Epoch())
	// Once the outer loop is over, iterating works again.
	assert.Len(t, epochBatches(t, l), 3)
	assert.Equal(t, 1, l.Epoch())
}

func TestBatchSize(t *testing.T) {
	assert.Zero(t, prepare.Batch{}.Size())
	assert.Zero(t, prepare.Batch{Inputs: []*tensors.Tensor{tensors.FromValue(float32(1))}}.Size())
	assert.Equal(t, 3, prepare.Batch{Inputs: []*tensors.Tensor{tensors.FromFlatDataAndDimensions([]float32{1, 2, 3, 4, 5, 6}, 3, 2)}}.Size())
}

// TestLoaderPositionFollowsSetEpoch: a checkpoint written between SetEpoch and the loop must say "the new
// epoch, from its first batch", not "the previous epoch, finished".
func TestLoaderPositionFollowsSetEpoch(t *testing.T) {
	l := newLoaders(t, loaderRuntimes(t, 1, 1), rangeSource(t, 6), prepare.BatchSize(2))[0]
	assert.Zero(t, l.Position())
	epochBatches(t, l)
	assert.Equal(t, 0, l.Epoch())
	assert.Equal(t, 3, l.Position(), "after a whole epoch, every batch was yielded")
	l.SetEpoch(1)
	assert.Equal(t, 1, l.Epoch())
	assert.Zero(t, l.Position(), "epoch 1 has not started")

	require.NoError(t, l.Restore(prepare.LoaderState{Epoch: 4, Consumed: 4}))
	l.SetEpoch(4)
	assert.Equal(t, 2, l.Position(), "SetEpoch with the restored epoch keeps the restored position")
	l.SetEpoch(5)
	assert.Zero(t, l.Position())
}

// TestLoaderSetEpochInsideTheLoop: the running iteration keeps its epoch; the next one uses the new epoch.
func TestLoaderSetEpochInsideTheLoop(t *testing.T) {
	opts := []prepare.LoaderOption{prepare.BatchSize(2), prepare.Shuffle(), prepare.Seed(1)}
	ref := newLoaders(t, loaderRuntimes(t, 1, 1), rangeSource(t, 8), opts...)[0]
	ref0 := indicesOf(epochBatches(t, ref))
	ref.SetEpoch(9)
	ref9 := indicesOf(epochBatches(t, ref))

	l := newLoaders(t, loaderRuntimes(t, 1, 1), rangeSource(t, 8), opts...)[0]
	var got []prepare.Batch
	for batch, err := range l.All() {
		require.NoError(t, err)
		l.SetEpoch(9)
		got = append(got, batch)
	}
	assert.Equal(t, ref0, indicesOf(got))
	for _, batch := range got {
		assert.Equal(t, 0, batch.Epoch)
	}
	assert.Equal(t, ref9, indicesOf(epochBatches(t, l)))
}

// failingSource fails to load the batch that contains failOn.
type failingSource struct {
	prepare.Source
	failOn int
}

func (s failingSource) Batch(indices []int) (inputs, labels []*tensors.Tensor, err error) {
	if slices.Contains(indices, s.failOn) {
		return nil, nil, fmt.Errorf("disk on fire at example %d", s.failOn)
	}
	return s.Source.Batch(indices)
}

func TestLoaderSourceError(t *testing.T) {
	rt := loaderRuntimes(t, 1, 1)[0]
	l := newLoaders(t, []*prepare.Runtime{rt}, failingSource{Source: rangeSource(t, 6), failOn: 3}, prepare.BatchSize(2))[0]
	var steps []int
	var errs []error
	for batch, err := range l.All() {
		steps = append(steps, batch.Step)
		errs = append(errs, err)
	}
	require.Len(t, errs, 2, "the iteration stops at the failing batch")
	assert.NoError(t, errs[0])
	require.Error(t, errs[1])
	assert.Contains(t, errs[1].Error(), "disk on fire at example 3")
	assert.Contains(t, errs[1].Error(), "batch 1 of epoch 0")
	assert.Equal(t, []int{0, 1}, steps)
	assert.False(t, rt.State.EndOfDataloader())

	_, err := newLoaders(t, []*prepare.Runtime{rt}, failingSource{Source: rangeSource(t, 6), failOn: 0}, prepare.BatchSize(2))[0].PeekBatch()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "disk on fire")
}

// TestLoaderEmptyShard: without even batches a rank may get no example at all; it yields no batch.
func TestLoaderEmptyShard(t *testing.T) {
	rts := loaderRuntimes(t, 4, 1)
	loaders := newLoaders(t, rts, rangeSource(t, 2), prepare.EvenBatches(false))
	for r, l := range loaders {
		batches := epochBatches(t, l)
		if r < 2 {
			assert.Len(t, batches, 1, "rank %d", r)
			continue
		}
		assert.Empty(t, batches, "rank %d", r)
		assert.Zero(t, l.Len())
		_, err := l.PeekBatch()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "empty")
	}
}

// countingSource records, in order, the batches its Batch was asked for and from how many goroutines at
// once: prefetching must keep calls sequential and in the epoch's order.
type countingSource struct {
	prepare.Source
	mu                sync.Mutex
	calls             [][]int
	inFlight, maxSeen int
}

func (s *countingSource) Batch(indices []int) (inputs, labels []*tensors.Tensor, err error) {
	s.mu.Lock()
	s.inFlight++
	s.maxSeen = max(s.maxSeen, s.inFlight)
	s.calls = append(s.calls, slices.Clone(indices))
	s.mu.Unlock()
	defer func() { s.mu.Lock(); s.inFlight--; s.mu.Unlock() }()
	return s.Source.Batch(indices)
}

// TestLoaderPrefetch: with prefetching (the default) the loader yields exactly the batches it yields without
// it, asks the source for each batch once, one at a time, and an early break leaves nothing behind that
// changes the next epoch.
func TestLoaderPrefetch(t *testing.T) {
	for _, prefetch := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefetch=%v", prefetch), func(t *testing.T) {
			src := &countingSource{Source: rangeSource(t, 37)}
			l := newLoaders(t, loaderRuntimes(t, 1, 1), src, prepare.BatchSize(4), prepare.Shuffle(),
				prepare.Prefetch(prefetch))[0]
			reference := newLoaders(t, loaderRuntimes(t, 1, 1), rangeSource(t, 37), prepare.BatchSize(4),
				prepare.Shuffle(), prepare.Prefetch(false))[0]
			got := indicesOf(epochBatches(t, l))
			assert.Equal(t, indicesOf(epochBatches(t, reference)), got)
			src.mu.Lock()
			assert.Equal(t, got, src.calls, "one source call per batch, in order")
			assert.Equal(t, 1, src.maxSeen, "the source is never called concurrently")
			src.mu.Unlock()

			for batch, err := range l.All() { // epoch 1, abandoned after its first batch
				require.NoError(t, err)
				require.Equal(t, 1, batch.Epoch)
				break
			}
			l.SetEpoch(2)
			reference.SetEpoch(2)
			assert.Equal(t, indicesOf(epochBatches(t, reference)), indicesOf(epochBatches(t, l)))
		})
	}
}

// TestLoaderSplitBatches: the batch size is global and divided among the ranks; the ranks' batches of a
// step together are the step's global batch, and the remainder counts global batches.
func TestLoaderSplitBatches(t *testing.T) {
	for _, tc := range []struct {
		ranks, global, n int
		wantPerRank      int
		wantErr          string
	}{
		{ranks: 1, global: 4, n: 10, wantPerRank: 4},
		{ranks: 2, global: 4, n: 10, wantPerRank: 2},
		{ranks: 4, global: 4, n: 10, wantPerRank: 1},
		{ranks: 2, global: 3, n: 10, wantErr: "global batch size 3 does not divide by the 2 processes"},
	} {
		t.Run(fmt.Sprintf("ranks=%d/global=%d", tc.ranks, tc.global), func(t *testing.T) {
			rts := loaderRuntimes(t, tc.ranks, 1)
			if tc.wantErr != "" {
				_, err := prepare.NewDataLoader(rts[0], rangeSource(t, tc.n), prepare.BatchSize(tc.global), prepare.SplitBatches())
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			loaders := newLoaders(t, rts, rangeSource(t, tc.n), prepare.BatchSize(tc.global), prepare.SplitBatches())
			for _, l := range loaders {
				assert.Equal(t, tc.wantPerRank, l.BatchSize())
			}
			perRank := allRanksEpoch(t, loaders)
			for step := range perRank[0] {
				var global []int
				for r := range tc.ranks {
					global = append(global, perRank[r][step].Indices...)
				}
				slices.Sort(global)
				want := identity(tc.n)[min(step*tc.global, tc.n):min((step+1)*tc.global, tc.n)]
				assert.Subset(t, global, want, "step %d covers the global batch", step)
			}
		})
	}
	_, err := prepare.NewStreamLoader(loaderRuntimes(t, 1, 1)[0], newListDataset(4, 2, 0), prepare.SplitBatches())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "split batches needs an indexable source")
}

// TestLoaderBatchesInBackendBuffers: a TensorSource's batches are gathered straight into the compute
// backend's buffers when those are host memory (the pure-Go backend's), so the training step reads them
// without copying; a batch stays valid after later ones, and a source of its own still yields host tensors.
func TestLoaderBatchesInBackendBuffers(t *testing.T) {
	rts := loaderRuntimes(t, 1, 1)
	require.True(t, rts[0].Backend.HasSharedBuffers())
	batches := epochBatches(t, newLoaders(t, rts, rangeSource(t, 10), prepare.BatchSize(4), prepare.Shuffle())[0])
	require.Len(t, batches, 3)
	for _, b := range batches {
		for _, tensor := range append(slices.Clone(b.Inputs), b.Labels...) {
			assert.True(t, tensor.IsOnDevice(0) && !tensor.IsLocal(), "step %d: in a backend buffer, no host copy", b.Step)
		}
		requireBatchMatchesIndices(t, b) // still right after the whole epoch was gathered
	}

	own := &countingSource{Source: rangeSource(t, 10)}
	for _, b := range epochBatches(t, newLoaders(t, loaderRuntimes(t, 1, 1), own, prepare.BatchSize(4))[0]) {
		assert.True(t, b.Inputs[0].IsLocal(), "step %d: a source's own tensors are passed through", b.Step)
	}
}
