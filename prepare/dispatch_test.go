package prepare_test

import (
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/prepare"
)

// dispatchRuntimes is loaderRuntimes for loaders that talk: one Runtime per rank of an in-process group.
func dispatchRuntimes(t *testing.T, ranks int) []*prepare.Runtime {
	t.Helper()
	loaderRuntimes(t, 1, 1) // makes the shared backend
	comms, err := backends.NewInProcessGroup(ranks)
	require.NoError(t, err)
	rts := make([]*prepare.Runtime, ranks)
	for r, comm := range comms {
		state, err := accumulate.NewGradientState(1, false)
		require.NoError(t, err)
		rts[r] = &prepare.Runtime{Backend: loaderBackend, Comm: comm, State: state}
	}
	t.Cleanup(func() {
		for _, rt := range rts {
			assert.NoError(t, rt.Comm.Close())
		}
	})
	return rts
}

// dispatchRun is what one rank's iteration of a dispatched loader yielded.
type dispatchRun struct {
	ids, valid, steps []int
	validPerRank      [][]int
	endFlags          []bool
	err               error
	errStep           int // the number of batches yielded before the error
	broadcasts        int64
}

// batchIDOf is batchID without require, for the ranks' goroutines.
func batchIDOf(b prepare.Batch) (int, error) {
	in, err := tensors.CopyFlatData[float32](b.Inputs[0])
	if err != nil {
		return 0, err
	}
	lab, err := tensors.CopyFlatData[int32](b.Labels[0])
	if err != nil {
		return 0, err
	}
	if len(in) == 0 || len(lab) == 0 || int(in[0]) != int(lab[0]) {
		return 0, fmt.Errorf("batch inputs %v and labels %v are not one dataset batch", in, lab)
	}
	return int(in[0]), nil
}

// runDispatched iterates every rank's loader once, the ranks on their own goroutines as in a job.
func runDispatched(rts []*prepare.Runtime, loaders []*prepare.DataLoader) []dispatchRun {
	return runDispatchedUpTo(rts, loaders, -1)
}

// runDispatchedUpTo is runDispatched leaving the loop after stopAfter batches on every rank (-1: never).
func runDispatchedUpTo(rts []*prepare.Runtime, loaders []*prepare.DataLoader, stopAfter int) []dispatchRun {
	runs := make([]dispatchRun, len(rts))
	var wg sync.WaitGroup
	for r := range rts {
		wg.Go(func() {
			run := &runs[r]
			before := rts[r].Comm.Stats().Of(backends.OpBroadcast).Calls
			defer func() { run.broadcasts = rts[r].Comm.Stats().Of(backends.OpBroadcast).Calls - before }()
			for batch, err := range loaders[r].All() {
				if err != nil {
					run.err, run.errStep = err, len(run.ids)
					return
				}
				id, err := batchIDOf(batch)
				if err != nil {
					run.err = err
					return
				}
				run.ids = append(run.ids, id)
				run.valid = append(run.valid, batch.Valid)
				run.steps = append(run.steps, batch.Step)
				run.validPerRank = append(run.validPerRank, batch.ValidPerRank)
				run.endFlags = append(run.endFlags, rts[r].State.EndOfDataloader())
				if len(run.ids) == stopAfter {
					break
				}
			}
		})
	}
	wg.Wait()
	return runs
}

// dispatchedLoaders makes a dispatched loader per rank; only rank 0 gets a dataset (the others nil).
func dispatchedLoaders(t *testing.T, rts []*prepare.Runtime, ds train.Dataset, opts ...prepare.LoaderOption) []*prepare.DataLoader {
	t.Helper()
	loaders := make([]*prepare.DataLoader, len(rts))
	for r, rt := range rts {
		var mine train.Dataset
		if r == 0 {
			mine = ds
		}
		l, err := prepare.NewStreamLoader(rt, mine, append([]prepare.LoaderOption{prepare.Dispatch()}, opts...)...)
		require.NoError(t, err, "rank %d", r)
		require.True(t, l.Dispatched())
		loaders[r] = l
	}
	return loaders
}

// TestDispatchedLoaderBatches: on 1, 2 and 4 ranks, over streams of every length up to 9 batches (most not a
// multiple of the ranks), with even batches, drop-last and uneven ends, every rank gets from rank 0 exactly
// the batches, steps, Valid counts and end-of-dataloader flag that reading the stream itself
// (NewStreamLoader) gives it, and all ranks take part in the same number of broadcasts: they end together.
func TestDispatchedLoaderBatches(t *testing.T) {
	for _, size := range []int{1, 2, 4} {
		for batches := 1; batches <= 9; batches++ {
			for name, opts := range map[string][]prepare.LoaderOption{
				"even":     nil,
				"droplast": {prepare.DropLast()},
				"uneven":   {prepare.EvenBatches(false)},
			} {
				if name == "droplast" && batches < size {
					continue // too short for one round: an error (TestDispatchedLoaderErrors)
				}
				t.Run(fmt.Sprintf("%d ranks/%d batches/%s", size, batches, name), func(t *testing.T) {
					rts := dispatchRuntimes(t, size)
					ds := newListDataset(batches, 2, 1)
					loaders := dispatchedLoaders(t, rts, ds, opts...)
					// The reference: each rank reading the stream itself.
					streamRts := loaderRuntimes(t, size, 1)
					streams := make([]*prepare.DataLoader, size)
					for r, rt := range streamRts {
						streams[r] = mustStreamLoader(t, rt, newListDataset(batches, 2, 1), opts...)
					}
					for epoch := range 2 {
						runs := runDispatched(rts, loaders)
						for r, run := range runs {
							require.NoError(t, run.err, "rank %d", r)
							want := runStream(t, streamRts[r], streams[r])
							require.NoError(t, want.err)
							assert.Equal(t, want.ids, run.ids, "rank %d epoch %d: batches", r, epoch)
							assert.Equal(t, want.valid, run.valid, "rank %d: Valid", r)
							assert.Equal(t, want.validPerRank, run.validPerRank, "rank %d: ValidPerRank", r)
							assert.Equal(t, want.endFlags, run.endFlags, "rank %d: end of dataloader", r)
							for i, step := range run.steps {
								assert.Equal(t, i, step, "rank %d: steps count from 0", r)
							}
							assert.Equal(t, runs[0].broadcasts, run.broadcasts, "rank %d: every rank takes part in "+
								"every round's broadcasts", r)
							assert.Equal(t, epoch, loaders[r].Epoch())
						}
						rounds := (batches + size - 1) / size
						if name == "droplast" {
							rounds = batches / size
						}
						assert.Equal(t, int64(2*rounds), runs[0].broadcasts, "two broadcasts a round, none after the last")
					}
					assert.Equal(t, 2, ds.resets, "rank 0 reads the stream from its start every epoch")
					assert.Equal(t, 2*(batches+1), ds.yields, "every batch and one io.EOF per epoch, read once")
				})
			}
		}
	}
}

// TestDispatchedLoaderRounds spells out what each rank gets from a stream of 7 batches on 3 ranks (the
// last holding one example): the last round has one batch, which the other ranks reuse as padding (Valid 0)
// with even batches, and which is the only batch of the round without them.
func TestDispatchedLoaderRounds(t *testing.T) {
	for _, tc := range []struct {
		name           string
		opts           []prepare.LoaderOption
		want, wantFlag [][]int
		wantValid      [][]int
	}{
		{name: "even", want: [][]int{{0, 3, 6}, {1, 4, 6}, {2, 5, 6}},
			wantValid: [][]int{{2, 2, 1}, {2, 2, 0}, {2, 2, 0}}, wantFlag: [][]int{{2}, {2}, {2}}},
		{name: "uneven", opts: []prepare.LoaderOption{prepare.EvenBatches(false)},
			want:      [][]int{{0, 3, 6}, {1, 4}, {2, 5}},
			wantValid: [][]int{{2, 2, 1}, {2, 2}, {2, 2}}, wantFlag: [][]int{{2}, {1}, {1}}},
		{name: "drop last", opts: []prepare.LoaderOption{prepare.DropLast()},
			want:      [][]int{{0, 3}, {1, 4}, {2, 5}},
			wantValid: [][]int{{2, 2}, {2, 2}, {2, 2}}, wantFlag: [][]int{{1}, {1}, {1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rts := dispatchRuntimes(t, 3)
			runs := runDispatched(rts, dispatchedLoaders(t, rts, newListDataset(7, 2, 1), tc.opts...))
			for r, run := range runs {
				require.NoError(t, run.err)
				assert.Equal(t, tc.want[r], run.ids, "rank %d", r)
				assert.Equal(t, tc.wantValid[r], run.valid, "rank %d", r)
				for i, end := range run.endFlags {
					assert.Equal(t, i == tc.wantFlag[r][0], end, "rank %d step %d: end of dataloader on its last batch", r, i)
				}
			}
		})
	}
}

func mustStreamLoader(t *testing.T, rt *prepare.Runtime, ds train.Dataset, opts ...prepare.LoaderOption) *prepare.DataLoader {
	t.Helper()
	l, err := prepare.NewStreamLoader(rt, ds, opts...)
	require.NoError(t, err)
	return l
}

// TestDispatchedLoaderResume: a dispatched loader's place is the number of stream batches consumed by the
// job (as NewStreamLoader's): after one step of 2 ranks it is 2, whatever rank; restored, rank 0 reads the
// stream from its start and skips them (a stream cannot seek), on the same number of ranks or another.
func TestDispatchedLoaderResume(t *testing.T) {
	rts := dispatchRuntimes(t, 2)
	loaders := dispatchedLoaders(t, rts, newListDataset(9, 2, 0))
	for r, run := range runDispatchedUpTo(rts, loaders, 1) {
		require.NoError(t, run.err)
		assert.Equal(t, []int{r}, run.ids)
		assert.Equal(t, prepare.LoaderState{Epoch: 0, Consumed: 2}, loaders[r].State(), "rank %d", r)
		assert.Equal(t, 1, loaders[r].Position())
	}
	saved := loaders[0].State()

	t.Run("same ranks", func(t *testing.T) {
		ds := newListDataset(9, 2, 0)
		loaders := dispatchedLoaders(t, rts, ds)
		for _, l := range loaders {
			require.NoError(t, l.Restore(saved))
		}
		runs := runDispatched(rts, loaders)
		want := [][]int{{2, 4, 6, 8}, {3, 5, 7, 8}}
		for r, run := range runs {
			require.NoError(t, run.err)
			assert.Equal(t, want[r], run.ids, "rank %d", r)
			assert.Equal(t, []int{1, 2, 3, 4}, run.steps, "rank %d: steps go on from the checkpoint's", r)
			assert.Equal(t, prepare.LoaderState{Epoch: 1}, loaders[r].State(), "after the epoch's last batch")
		}
		assert.Equal(t, 10, ds.yields, "the two consumed batches are read again and dropped, then the rest and io.EOF")
	})
	t.Run("four ranks", func(t *testing.T) {
		rts4 := dispatchRuntimes(t, 4)
		loaders := dispatchedLoaders(t, rts4, newListDataset(9, 2, 0))
		for _, l := range loaders {
			require.NoError(t, l.Restore(saved))
		}
		// Batches 2…8 in rounds of four: {2,3,4,5} {6,7,8,pad}.
		want := [][]int{{2, 6}, {3, 7}, {4, 8}, {5, 6}}
		for r, run := range runDispatched(rts4, loaders) {
			require.NoError(t, run.err)
			assert.Equal(t, want[r], run.ids, "rank %d", r)
			assert.Equal(t, []int{0, 1}, run.steps, "two consumed batches are no whole round of four")
		}
	})
	t.Run("past the end", func(t *testing.T) {
		loaders := dispatchedLoaders(t, rts, newListDataset(3, 2, 0))
		for _, l := range loaders {
			require.NoError(t, l.Restore(prepare.LoaderState{Epoch: 2, Consumed: 8}))
		}
		for r, run := range runDispatched(rts, loaders) {
			require.NoError(t, run.err, "an epoch consumed whole is no error")
			assert.Empty(t, run.ids, "rank %d", r)
			assert.Equal(t, int64(2), run.broadcasts, "one message says there is nothing left")
		}
	})
}

// TestDispatchedLoaderErrors: rank 0's failure to read reaches every rank at the same step, so none waits
// for a batch that will not come; rank 0 keeps the dataset's own error.
func TestDispatchedLoaderErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ds        *listDataset
		opts      []prepare.LoaderOption
		wantSteps int
		want      string
	}{
		{name: "empty dataset", ds: newListDataset(0, 2, 0), want: "0 batch"},
		{name: "too short to drop last", ds: newListDataset(1, 2, 0), opts: []prepare.LoaderOption{prepare.DropLast()},
			want: "too few for one round of 2 rank(s)"},
		{name: "read error in the first round", ds: &listDataset{rows: []int{1, 1, 1}, failAt: 1}, want: "dataset broken"},
		// Rank 0 reads a round ahead: the failure in round 2 comes before round 1's batches.
		{name: "read error later", ds: &listDataset{rows: []int{1, 1, 1, 1, 1, 1, 1}, failAt: 5}, wantSteps: 1,
			want: "dataset broken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rts := dispatchRuntimes(t, 2)
			runs := runDispatched(rts, dispatchedLoaders(t, rts, tc.ds, tc.opts...))
			for r, run := range runs {
				require.Error(t, run.err, "rank %d", r)
				assert.Contains(t, run.err.Error(), tc.want, "rank %d", r)
				assert.Equal(t, tc.wantSteps, run.errStep, "rank %d: the error comes at the same step everywhere", r)
			}
			if tc.ds.failAt >= 0 {
				assert.ErrorIs(t, runs[0].err, errDatasetBroken, "rank 0 returns the dataset's error itself")
				assert.Contains(t, runs[1].err.Error(), "rank 0 could not dispatch")
			}
		})
	}
	t.Run("construction", func(t *testing.T) {
		rts := dispatchRuntimes(t, 2)
		_, err := prepare.NewStreamLoader(rts[0], nil, prepare.Dispatch())
		require.ErrorContains(t, err, "nil", "rank 0 reads the dataset: it must have one")
		_, err = prepare.NewStreamLoader(rts[1], nil)
		require.ErrorContains(t, err, "nil", "without Dispatch every rank reads")
		_, err = prepare.NewDataLoader(rts[0], rangeSource(t, 4), prepare.Dispatch())
		require.ErrorContains(t, err, "streams")
	})
}

// tensorDataset yields the same batch twice: several inputs and labels of assorted dtypes and ranks,
// a scalar and an empty tensor among them.
type tensorDataset struct {
	inputs, labels []*tensors.Tensor
	pos            int
}

func (d *tensorDataset) Name() string { return "tensors" }
func (d *tensorDataset) Reset()       { d.pos = 0 }
func (d *tensorDataset) Yield() (any, []*tensors.Tensor, []*tensors.Tensor, error) {
	if d.pos == 2 {
		return nil, nil, nil, io.EOF
	}
	d.pos++
	return nil, d.inputs, d.labels, nil
}

// TestDispatchedLoaderDTypes: what a rank receives is rank 0's tensors byte for byte, in shape and dtype,
// whatever the dtype, for every input and label.
func TestDispatchedLoaderDTypes(t *testing.T) {
	ds := &tensorDataset{
		inputs: []*tensors.Tensor{
			tensors.FromFlatDataAndDimensions([]uint8{1, 2, 3, 4, 5, 6}, 2, 3),
			tensors.FromFlatDataAndDimensions([]float64{0.5, -1e300}, 2),
			tensors.FromFlatDataAndDimensions([]bool{true, false}, 2, 1),
			tensors.FromShape(shapes.Make(dtypes.Float32, 0, 3)),
			tensors.FromScalar(int16(-7)),
		},
		labels: []*tensors.Tensor{
			tensors.FromFlatDataAndDimensions([]int64{1 << 40, -3}, 2),
			tensors.FromFlatDataAndDimensions([]float32{0.25, 8}, 2, 1, 1),
		},
	}
	rts := dispatchRuntimes(t, 2)
	loaders := dispatchedLoaders(t, rts, ds)
	got := make([]prepare.Batch, 2)
	var wg sync.WaitGroup
	for r := range rts {
		wg.Go(func() {
			for batch, err := range loaders[r].All() {
				if assert.NoError(t, err) && batch.Step == 0 {
					got[r] = batch
				}
			}
		})
	}
	wg.Wait()
	for r, b := range got {
		require.Len(t, b.Inputs, len(ds.inputs), "rank %d", r)
		require.Len(t, b.Labels, len(ds.labels), "rank %d", r)
		assert.Equal(t, 2, b.Valid)
		for i, want := range append(append([]*tensors.Tensor{}, ds.inputs...), ds.labels...) {
			have := append(append([]*tensors.Tensor{}, b.Inputs...), b.Labels...)[i]
			assert.True(t, want.Shape().Equal(have.Shape()), "rank %d tensor %d: %s, want %s", r, i, have.Shape(), want.Shape())
			if want.Shape().Size() > 0 {
				assert.Equal(t, tensorBytes(t, want), tensorBytes(t, have), "rank %d tensor %d", r, i)
			}
		}
	}
}

func tensorBytes(t *testing.T, x *tensors.Tensor) []byte {
	var out []byte
	require.NoError(t, x.ConstBytes(func(b []byte) { out = append(out, b...) }))
	return out
}

// TestDispatchedLoaderOnlyRankZeroReads: the datasets other ranks pass are never touched.
func TestDispatchedLoaderOnlyRankZeroReads(t *testing.T) {
	rts := dispatchRuntimes(t, 3)
	datasets := []*listDataset{newListDataset(5, 1, 0), newListDataset(5, 1, 0), newListDataset(5, 1, 0)}
	loaders := make([]*prepare.DataLoader, 3)
	for r, rt := range rts {
		var err error
		loaders[r], err = prepare.NewStreamLoader(rt, datasets[r], prepare.Dispatch())
		require.NoError(t, err)
	}
	for _, run := range runDispatched(rts, loaders) {
		require.NoError(t, run.err)
	}
	assert.Equal(t, 6, datasets[0].yields)
	for r := 1; r < 3; r++ {
		assert.Zero(t, datasets[r].yields+datasets[r].resets, "rank %d's dataset", r)
	}
}
