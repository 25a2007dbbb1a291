package prepare_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/prepare"
)

// listDataset is a train.Dataset of len(rows) batches; batch k has rows[k] examples, all of value k (inputs
// float32 [rows], labels int32 [rows, 1]). It is strict: reading past io.EOF without Reset is an error,
// since train.Dataset promises nothing more.
type listDataset struct {
	rows   []int
	failAt int // the batch whose read fails; -1 for none
	pos    int
	eof    bool
	resets int
	yields int
}

var _ train.Dataset = (*listDataset)(nil)

var errDatasetBroken = errors.New("dataset broken")

func newListDataset(batches, rowsPerBatch, lastRows int) *listDataset {
	d := &listDataset{failAt: -1}
	for k := range batches {
		rows := rowsPerBatch
		if k == batches-1 && lastRows > 0 {
			rows = lastRows
		}
		d.rows = append(d.rows, rows)
	}
	return d
}

func (d *listDataset) Name() string { return "list" }

func (d *listDataset) Reset() { d.pos, d.eof, d.resets = 0, false, d.resets+1 }

func (d *listDataset) Yield() (spec any, inputs, labels []*tensors.Tensor, err error) {
	d.yields++
	if d.eof {
		return nil, nil, nil, errors.New("listDataset: Yield after io.EOF without Reset")
	}
	if d.pos == d.failAt {
		return nil, nil, nil, errDatasetBroken
	}
	if d.pos >= len(d.rows) {
		d.eof = true
		return nil, nil, nil, io.EOF
	}
	k, n := d.pos, d.rows[d.pos]
	d.pos++
	in := make([]float32, n)
	lab := make([]int32, n)
	for i := range n {
		in[i], lab[i] = float32(k), int32(k)
	}
	return nil, []*tensors.Tensor{tensors.FromFlatDataAndDimensions(in, n)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(lab, n, 1)}, nil
}

// batchID is the dataset batch a stream batch came from.
func batchID(t *testing.T, b prepare.Batch) int {
	t.Helper()
	in := tensors.MustCopyFlatData[float32](b.Inputs[0])
	lab := tensors.MustCopyFlatData[int32](b.Labels[0])
	require.NotEmpty(t, in)
	require.Equal(t, int(in[0]), int(lab[0]), "inputs and labels of one dataset batch stay together")
	return int(in[0])
}

type streamRun struct {
	ids, valid   []int
	validPerRank [][]int
	endFlags     []bool
	err          error
}

// runStream iterates l once, recording each batch and whether the gradient state saw the last batch.
func runStream(t *testing.T, rt *prepare.Runtime, l *prepare.DataLoader) streamRun {
	t.Helper()
	var run streamRun
	for batch, err := range l.All() {
		if err != nil {
			run.err = err
			break
		}
		assert.Equal(t, len(run.ids), batch.Step)
		assert.Nil(t, batch.Indices, "a stream has no indices")
		run.ids = append(run.ids, batchID(t, batch))
		run.valid = append(run.valid, batch.Valid)
		run.validPerRank = append(run.validPerRank, batch.ValidPerRank)
		run.endFlags = append(run.endFlags, rt.State.EndOfDataloader())
	}
	assert.False(t, rt.State.EndOfDataloader(), "after the loop")
	return run
}

func TestStreamLoaderSharding(t *testing.T) {
	tests := []struct {
		name             string
		batches, size    int
		lastRows         int // rows of the dataset's last batch (others have 2); 0: 2
		opts             []prepare.LoaderOption
		want             [][]int // rank → dataset batch ids
		wantValid        [][]int // rank → Valid per step
		wantValidPerRank [][]int // step → ValidPerRank (rank 0's view)
	}{
		{name: "divisible", batches: 6, size: 3,
			want:      [][]int{{0, 3}, {1, 4}, {2, 5}},
			wantValid: [][]int{{2, 2}, {2, 2}, {2, 2}}, wantValidPerRank: [][]int{{2, 2, 2}, {2, 2, 2}}},
		{name: "one rank", batches: 3, size: 1, lastRows: 1,
			want: [][]int{{0, 1, 2}}, wantValid: [][]int{{2, 2, 1}}, wantValidPerRank: [][]int{{2}, {2}, {1}}},
		{name: "incomplete round padded", batches: 7, size: 3, lastRows: 1,
			want:             [][]int{{0, 3, 6}, {1, 4, 6}, {2, 5, 6}},
			wantValid:        [][]int{{2, 2, 1}, {2, 2, 0}, {2, 2, 0}},
			wantValidPerRank: [][]int{{2, 2, 2}, {2, 2, 2}, {1, 0, 0}}},
		{name: "round of two padded", batches: 8, size: 3,
			want:             [][]int{{0, 3, 6}, {1, 4, 7}, {2, 5, 6}},
			wantValid:        [][]int{{2, 2, 2}, {2, 2, 2}, {2, 2, 0}},
			wantValidPerRank: [][]int{{2, 2, 2}, {2, 2, 2}, {2, 2, 0}}},
		{name: "fewer batches than ranks", batches: 2, size: 3,
			want: [][]int{{0}, {1}, {0}}, wantValid: [][]int{{2}, {2}, {0}}, wantValidPerRank: [][]int{{2, 2, 0}}},
		{name: "drop last", batches: 7, size: 3, opts: []prepare.LoaderOption{prepare.DropLast()},
			want:      [][]int{{0, 3}, {1, 4}, {2, 5}},
			wantValid: [][]int{{2, 2}, {2, 2}, {2, 2}}, wantValidPerRank: [][]int{{2, 2, 2}, {2, 2, 2}}},
		{name: "drop last of a round of two", batches: 8, size: 3, opts: []prepare.LoaderOption{prepare.DropLast()},
			want:      [][]int{{0, 3}, {1, 4}, {2, 5}},
			wantValid: [][]int{{2, 2}, {2, 2}, {2, 2}}, wantValidPerRank: [][]int{{2, 2, 2}, {2, 2, 2}}},
		{name: "uneven", batches: 8, size: 3, opts: []prepare.LoaderOption{prepare.EvenBatches(false)},
			want:             [][]int{{0, 3, 6}, {1, 4, 7}, {2, 5}},
			wantValid:        [][]int{{2, 2, 2}, {2, 2, 2}, {2, 2}},
			wantValidPerRank: [][]int{{2, 2, 2}, {2, 2, 2}, {2, 2, 0}}},
		{name: "uneven, a rank without batches", batches: 2, size: 3, opts: []prepare.LoaderOption{prepare.EvenBatches(false)},
			want: [][]int{{0}, {1}, {}}, wantValid: [][]int{{2}, {2}, {}}, wantValidPerRank: [][]int{{2, 2, 0}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rts := loaderRuntimes(t, tc.size, 1)
			for r, rt := range rts {
				ds := newListDataset(tc.batches, 2, tc.lastRows)
				l, err := prepare.NewStreamLoader(rt, ds, tc.opts...)
				require.NoError(t, err)
				assert.Equal(t, -1, l.Len(), "a stream's length is unknown")
				for epoch := range 2 {
					run := runStream(t, rt, l)
					require.NoError(t, run.err, "rank %d", r)
					assert.Equal(t, epoch, l.Epoch())
					assert.Equal(t, tc.want[r], append([]int{}, run.ids...), "rank %d epoch %d", r, epoch)
					assert.Equal(t, tc.wantValid[r], append([]int{}, run.valid...), "rank %d", r)
					wantFlags := make([]bool, len(tc.want[r]))
					if len(wantFlags) > 0 {
						wantFlags[len(wantFlags)-1] = true
					}
					assert.Equal(t, wantFlags, append([]bool{}, run.endFlags...), "rank %d: end of dataloader on the last batch only", r)
					if r == 0 {
						assert.Equal(t, tc.wantValidPerRank, run.validPerRank)
					}
					for step, vpr := range run.validPerRank {
						assert.Equal(t, run.valid[step], vpr[r], "rank %d step %d: Valid is this rank's entry", r, step)
					}
				}
				assert.Equal(t, 2, ds.resets, "every iteration starts from the beginning of the dataset")
			}
		})
	}
}

func TestStreamLoaderEvenBatchesAcrossRanks(t *testing.T) {
	// With even batches every rank yields the same number of batches, whatever the dataset's length.
	for batches := 1; batches <= 10; batches++ {
		for _, size := range []int{1, 2, 3, 4} {
			rts := loaderRuntimes(t, size, 1)
			counts := make([]int, size)
			totalValid := 0
			for r, rt := range rts {
				l, err := prepare.NewStreamLoader(rt, newListDataset(batches, 3, 0))
				require.NoError(t, err)
				run := runStream(t, rt, l)
				require.NoError(t, run.err)
				counts[r] = len(run.ids)
				for _, v := range run.valid {
					totalValid += v
				}
			}
			wantSteps := (batches + size - 1) / size
			for r := range counts {
				assert.Equal(t, wantSteps, counts[r], "%d batches on %d ranks: rank %d", batches, size, r)
			}
			assert.Equal(t, 3*batches, totalValid, "%d batches on %d ranks: Valid counts every real example once", batches, size)
		}
	}
}

func TestStreamLoaderErrors(t *testing.T) {
	rts := loaderRuntimes(t, 3, 1)
	t.Run("nil dataset", func(t *testing.T) {
		_, err := prepare.NewStreamLoader(rts[0], nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "nil")
	})
	t.Run("bad batch size", func(t *testing.T) {
		_, err := prepare.NewStreamLoader(rts[0], newListDataset(3, 1, 0), prepare.BatchSize(0))
		require.Error(t, err)
	})
	tests := []struct {
		name         string
		ds           *listDataset
		opts         []prepare.LoaderOption
		wantContains []string
		wantIs       error
	}{
		{name: "empty dataset", ds: newListDataset(0, 2, 0), wantContains: []string{`"list"`, "0 batch", "3 rank"}},
		{name: "too short to drop last", ds: newListDataset(2, 2, 0), opts: []prepare.LoaderOption{prepare.DropLast()},
			wantContains: []string{"2 batch", "3 rank"}},
		{name: "read error in the first round", ds: &listDataset{rows: []int{1, 1, 1, 1}, failAt: 1},
			wantContains: []string{`reading dataset "list"`}, wantIs: errDatasetBroken},
		{name: "read error later", ds: &listDataset{rows: []int{1, 1, 1, 1, 1, 1, 1}, failAt: 5},
			wantContains: []string{`reading dataset "list"`}, wantIs: errDatasetBroken},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := prepare.NewStreamLoader(rts[0], tc.ds, tc.opts...)
			require.NoError(t, err)
			run := runStream(t, rts[0], l)
			require.Error(t, run.err)
			for _, s := range tc.wantContains {
				assert.Contains(t, run.err.Error(), s)
			}
			if tc.wantIs != nil {
				assert.ErrorIs(t, run.err, tc.wantIs)
			}
		})
	}
}

// TestStreamLoaderStopsAtEOF: io.EOF ends the stream; the loader must not read on (train.Dataset only
// promises a Reset after io.EOF).
func TestStreamLoaderStopsAtEOF(t *testing.T) {
	for batches := 1; batches <= 7; batches++ {
		t.Run(fmt.Sprintf("%d batches", batches), func(t *testing.T) {
			rt := loaderRuntimes(t, 3, 1)[0]
			ds := newListDataset(batches, 1, 0)
			l, err := prepare.NewStreamLoader(rt, ds)
			require.NoError(t, err)
			run := runStream(t, rt, l)
			require.NoError(t, run.err)
			assert.Equal(t, batches+1, ds.yields, "every batch and one io.EOF")
		})
	}
}

func TestStreamLoaderRestore(t *testing.T) {
	rts := loaderRuntimes(t, 2, 1)
	for r, rt := range rts {
		ds := newListDataset(7, 2, 1) // rounds {0,1} {2,3} {4,5} {6,pad}
		l, err := prepare.NewStreamLoader(rt, ds)
		require.NoError(t, err)
		// Two rounds of two ranks: four stream batches consumed.
		state, err := l.StateAfterBatches(3, 2)
		require.NoError(t, err)
		assert.Equal(t, prepare.LoaderState{Epoch: 3, Consumed: 4}, state)
		require.NoError(t, l.Restore(state))
		var ids, steps []int
		for batch, err := range l.All() {
			require.NoError(t, err)
			assert.Equal(t, 3, batch.Epoch)
			ids, steps = append(ids, batchID(t, batch)), append(steps, batch.Step)
			assert.Equal(t, batch.Step+1, l.Position())
		}
		assert.Equal(t, []int{2, 3}, steps, "rank %d", r)
		assert.Equal(t, [][]int{{4, 6}, {5, 6}}[r], ids, "rank %d", r)

		// Past the end: nothing left, and no error.
		require.NoError(t, l.Restore(prepare.LoaderState{Epoch: 3, Consumed: 20}))
		assert.Empty(t, runStream(t, rt, l).ids)
		// The next iteration is a whole epoch.
		run := runStream(t, rt, l)
		require.NoError(t, run.err)
		assert.Equal(t, [][]int{{0, 2, 4, 6}, {1, 3, 5, 6}}[r], run.ids)
		assert.Equal(t, 4, l.Epoch())

		require.Error(t, l.Restore(prepare.LoaderState{Epoch: 0, Consumed: -1}))
	}
}

func TestStreamLoaderNoPeek(t *testing.T) {
	rt := loaderRuntimes(t, 1, 1)[0]
	l, err := prepare.NewStreamLoader(rt, newListDataset(2, 1, 0))
	require.NoError(t, err)
	_, err = l.PeekBatch()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "indexable")
}

// TestStreamLoaderDrivesAccumulate: K=2 over 5 stream batches on one rank syncs on the 2nd, 4th and 5th.
func TestStreamLoaderDrivesAccumulate(t *testing.T) {
	rts := loaderRuntimes(t, 1, 2)
	state := rts[0].State
	l, err := prepare.NewStreamLoader(rts[0], newListDataset(5, 1, 0))
	require.NoError(t, err)
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
	assert.Equal(t, []int{2, 4, 5}, synced)
}
