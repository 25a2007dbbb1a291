package accel_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// idStream is a train.Dataset of batches of testmodel's examples: batch k holds rows examples, and a second
// input, which the MLP ignores, tells k, so that a rank can say which batches it trained on.
type idStream struct {
	batches, rows, pos int
	inputs, labels     *tensors.Tensor
}

func newIDStream(batches, rows int) *idStream {
	in, lab := testmodel.Data(batches*rows, 3)
	return &idStream{batches: batches, rows: rows, inputs: in, labels: lab}
}

func (s *idStream) Name() string { return "ids" }
func (s *idStream) Reset()       { s.pos = 0 }
func (s *idStream) Yield() (any, []*tensors.Tensor, []*tensors.Tensor, error) {
	if s.pos == s.batches {
		return nil, nil, nil, io.EOF
	}
	k := s.pos
	s.pos++
	ids := make([]int32, s.rows)
	for i := range ids {
		ids[i] = int32(k)
	}
	from, to := k*s.rows, (k+1)*s.rows
	return nil, []*tensors.Tensor{testmodel.Rows(s.inputs, from, to), tensors.FromFlatDataAndDimensions(ids, s.rows)},
		[]*tensors.Tensor{testmodel.Rows(s.labels, from, to)}, nil
}

// dispatchRun configures dispatchTrain.
type dispatchRun struct {
	opts      []accel.LoaderOption
	load      string // a checkpoint to resume from
	saveAfter int    // save a checkpoint into saveDir after this many batches and stop; 0: train the epoch
	saveDir   string
}

type dispatchResult struct {
	IDs        []int              `json:"ids"`
	Steps      []int              `json:"steps"`
	Params     testmodel.Snapshot `json:"params"`
	Checkpoint string             `json:"checkpoint"`
	Broadcasts int64              `json:"broadcasts"`
}

// dispatchTrain trains the test MLP for one epoch of ds as a loop would: the model is built from an example
// batch first (a stream cannot be peeked at), then every batch is accumulated and stepped.
func dispatchTrain(acc *accel.Accelerator, ds train.Dataset, run dispatchRun) (dispatchResult, error) {
	var res dispatchResult
	model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
	if err != nil {
		return res, err
	}
	opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.SGD))
	if err != nil {
		return res, err
	}
	loader, err := acc.PrepareDataset(ds, run.opts...)
	if err != nil {
		return res, err
	}
	example := newIDStream(1, 2)
	_, in, lab, _ := example.Yield()
	if err := model.Materialize(accel.Batch{Inputs: in, Labels: lab}); err != nil {
		return res, err
	}
	if run.load != "" {
		if err := acc.LoadState(run.load); err != nil {
			return res, err
		}
	}
	before := acc.Communicator().Stats().Of(backends.OpBroadcast).Calls
	for batch, err := range loader.All() {
		if err != nil {
			return res, err
		}
		ids, err := tensors.CopyFlatData[int32](batch.Inputs[1])
		if err != nil {
			return res, err
		}
		res.IDs, res.Steps = append(res.IDs, int(ids[0])), append(res.Steps, batch.Step)
		err = acc.Accumulate(func() error {
			if _, err := acc.Backward(model, batch); err != nil {
				return err
			}
			if _, err := opt.Step(); err != nil {
				return err
			}
			return opt.ZeroGrad()
		})
		if err != nil {
			return res, err
		}
		if run.saveAfter > 0 && len(res.IDs) == run.saveAfter {
			if res.Checkpoint, err = acc.SaveState(run.saveDir); err != nil {
				return res, err
			}
			break
		}
	}
	res.Broadcasts = acc.Communicator().Stats().Of(backends.OpBroadcast).Calls - before
	res.Params, err = testmodel.TakeSnapshot(model.Parameters())
	return res, err
}

// streamFor gives rank 0 the stream and, when dispatched, the other ranks none.
func streamFor(rank int, dispatched bool, batches, rows int) train.Dataset {
	if dispatched && rank != 0 {
		return nil
	}
	return newIDStream(batches, rows)
}

// TestDispatchBatches: on 1, 2 and 4 processes, over a stream of 7 batches (a multiple of neither 2 nor 4),
// every process trains on the batches rank 0 sends it — rank r on batches r, r+N, …, the last round padded
// with its first batch — in order, all end the epoch at the same step, and the weights are bitwise those of
// every process reading the stream itself.
func TestDispatchBatches(t *testing.T) {
	const batches, rows = 7, 3
	for _, n := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("%d processes", n), func(t *testing.T) {
			results := map[bool][]dispatchResult{true: make([]dispatchResult, n), false: make([]dispatchResult, n)}
			for _, dispatched := range []bool{true, false} {
				var opts []accel.LoaderOption
				if dispatched {
					opts = append(opts, accel.DispatchBatches())
				}
				runRanks(t, n, nil, func(rank int, acc *accel.Accelerator) error {
					var err error
					results[dispatched][rank], err = dispatchTrain(acc, streamFor(rank, dispatched, batches, rows),
						dispatchRun{opts: opts})
					return err
				})
			}
			rounds := (batches + n - 1) / n
			for r, got := range results[true] {
				var want, steps []int
				for step := range rounds {
					k := step*n + r
					if k >= batches {
						k = step * n // the padding: the round's first batch
					}
					want, steps = append(want, k), append(steps, step)
				}
				assert.Equal(t, want, got.IDs, "process %d", r)
				assert.Equal(t, steps, got.Steps, "process %d", r)
				assert.Equal(t, results[false][r].IDs, got.IDs, "process %d: the batches of reading the stream itself", r)
				assert.Equal(t, results[false][r].Params, got.Params, "process %d: the weights of reading the stream itself", r)
				assert.Equal(t, results[true][0].Broadcasts, got.Broadcasts, "process %d ends with the others", r)
			}
		})
	}
}

// TestDispatchBatchesResume: a checkpoint taken mid-epoch under DispatchBatches resumes where it was: rank 0
// reads the stream from its start and skips the batches the job consumed (two rounds of two), and the job
// ends with the weights of one that was never interrupted. On four processes it resumes too, with the rest
// of the epoch in rounds of four.
func TestDispatchBatchesResume(t *testing.T) {
	const batches, rows = 9, 2
	dispatch := []accel.LoaderOption{accel.DispatchBatches()}
	whole := make([]dispatchResult, 2)
	runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
		var err error
		whole[rank], err = dispatchTrain(acc, streamFor(rank, true, batches, rows), dispatchRun{opts: dispatch})
		return err
	})
	dir := t.TempDir()
	saved := make([]dispatchResult, 2)
	runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
		var err error
		saved[rank], err = dispatchTrain(acc, streamFor(rank, true, batches, rows),
			dispatchRun{opts: dispatch, saveAfter: 2, saveDir: dir})
		return err
	})
	resumed := make([]dispatchResult, 2)
	runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
		var err error
		resumed[rank], err = dispatchTrain(acc, streamFor(rank, true, batches, rows),
			dispatchRun{opts: dispatch, load: saved[0].Checkpoint})
		return err
	})
	for r := range 2 {
		assert.Equal(t, whole[r].IDs[:2], saved[r].IDs, "process %d before the checkpoint", r)
		assert.Equal(t, whole[r].IDs[2:], resumed[r].IDs, "process %d after it", r)
		assert.Equal(t, []int{2, 3, 4}, resumed[r].Steps, "process %d: steps go on", r)
		assert.Equal(t, whole[r].Params, resumed[r].Params, "process %d: the weights of an uninterrupted run", r)
	}

	four := make([]dispatchResult, 4)
	runRanks(t, 4, nil, func(rank int, acc *accel.Accelerator) error {
		var err error
		four[rank], err = dispatchTrain(acc, streamFor(rank, true, batches, rows),
			dispatchRun{opts: dispatch, load: saved[0].Checkpoint})
		return err
	})
	// The five batches left, 4…8, in rounds of four: {4,5,6,7} {8,pad}.
	for r, want := range [][]int{{4, 8}, {5, 8}, {6, 8}, {7, 8}} {
		assert.Equal(t, want, four[r].IDs, "process %d of four", r)
		assert.Equal(t, []int{1, 2}, four[r].Steps, "process %d of four: four consumed batches are one round", r)
	}
}

// TestMPIDispatchBatches: under mpirun with 2 processes, rank 0 alone holds the stream of 5 batches and
// each process trains on its own: rank 0 on 0, 2, 4, rank 1 on 1, 3 and 4 (padding), both ending together.
func TestMPIDispatchBatches(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			acc, err := accel.New(accel.WithBackend("go"))
			if err != nil {
				return nil, err
			}
			res, err := dispatchTrain(acc, streamFor(acc.Rank(), true, 5, 2),
				dispatchRun{opts: []accel.LoaderOption{accel.DispatchBatches()}})
			return res, errors.Join(err, acc.Close())
		})
		return
	}
	results := mpitest.Run(t, 2, t.Name())
	require.Len(t, results, 2)
	got := make([]dispatchResult, 2)
	for _, r := range results {
		require.NoError(t, r.Decode(&got[r.Rank]))
	}
	assert.Equal(t, []int{0, 2, 4}, got[0].IDs)
	assert.Equal(t, []int{1, 3, 4}, got[1].IDs)
	assert.Equal(t, got[0].Broadcasts, got[1].Broadcasts, "both processes took part in every round")
	assert.Equal(t, got[0].Params, got[1].Params, "the replicas stayed identical")
}
