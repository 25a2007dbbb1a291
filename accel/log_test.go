package accel_test

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// logRow is one parsed record of a tracker file.
type logRow struct {
	Step    int64
	Metrics map[string]float64
}

func readJSONLines(t *testing.T, path string) []logRow {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var rows []logRow
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var rec map[string]float64
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		step := int64(rec["step"])
		delete(rec, "step")
		rows = append(rows, logRow{step, rec})
	}
	return rows
}

func readCSV(t *testing.T, path string) []logRow {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	records, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.NotEmpty(t, records)
	header := records[0]
	require.Equal(t, "step", header[0])
	var rows []logRow
	for _, rec := range records[1:] {
		require.NotEqual(t, "step", rec[0], "one header only")
		step, err := strconv.ParseInt(rec[0], 10, 64)
		require.NoError(t, err)
		row := logRow{step, map[string]float64{}}
		for i, cell := range rec[1:] {
			if cell != "" {
				row.Metrics[header[i+1]], err = strconv.ParseFloat(cell, 64)
				require.NoError(t, err)
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// loggedRun trains with Log after every optimizer step: loss and step², and an "eval" metric on even steps
// only. It saves at saveAt (if > 0) and stops after stopAt optimizer steps (if > 0).
func loggedRun(t *testing.T, dir string, resume bool, saveAt, stopAt int64) {
	acc := newSingle(t, accel.WithGradientAccumulationSteps(2), accel.WithTrackers(
		accel.NewJSONLinesTracker(filepath.Join(dir, "log.jsonl")), accel.NewCSVTracker(filepath.Join(dir, "log.csv"))))
	r := prepareResumable(t, acc, 24, 2, 1) // 6 optimizer steps per epoch
	if resume {
		require.NoError(t, acc.LoadState(filepath.Join(dir, "ckpt")))
	}
	for batch, err := range r.loader.All() {
		require.NoError(t, err)
		var loss float64
		require.NoError(t, acc.Accumulate(func() error {
			var err error
			if loss, err = acc.Backward(r.model, batch); err != nil {
				return err
			}
			stepped, err := r.opt.Step()
			if err != nil || !stepped {
				return err
			}
			step := r.opt.Steps()
			metrics := map[string]float64{"loss": loss, "step_squared": float64(step * step)}
			if step%2 == 0 {
				metrics["eval"] = float64(step) / 10
			}
			if err := acc.Log(step, metrics); err != nil {
				return err
			}
			if step == saveAt {
				if _, err := acc.SaveState(filepath.Join(dir, "ckpt")); err != nil {
					return err
				}
			}
			return r.opt.ZeroGrad()
		}))
		if stopAt > 0 && r.opt.Steps() == stopAt {
			break
		}
	}
	require.NoError(t, acc.Close())
}

// TestLogTrackersAcrossResume: a run saved at step 3 that went on logging steps 4 and 5 before it
// stopped, resumed from the checkpoint, leaves JSON Lines and CSV logs with each of the 6 steps exactly
// once — the same rows as a run that never stopped — and a fresh run starts its logs afresh.
func TestLogTrackersAcrossResume(t *testing.T) {
	straight, interrupted := t.TempDir(), t.TempDir()
	loggedRun(t, straight, false, 0, 0)
	loggedRun(t, interrupted, false, 3, 5)
	loggedRun(t, interrupted, true, 0, 0)
	for _, tc := range []struct {
		file string
		read func(*testing.T, string) []logRow
	}{{"log.jsonl", readJSONLines}, {"log.csv", readCSV}} {
		t.Run(tc.file, func(t *testing.T) {
			want := tc.read(t, filepath.Join(straight, tc.file))
			require.Len(t, want, 6)
			for i, row := range want {
				step := int64(i + 1)
				assert.Equal(t, step, row.Step)
				assert.Equal(t, float64(step*step), row.Metrics["step_squared"])
				_, hasEval := row.Metrics["eval"]
				assert.Equal(t, step%2 == 0, hasEval, "step %d", step)
			}
			assert.Equal(t, want, tc.read(t, filepath.Join(interrupted, tc.file)), "resumed log")
		})
	}
	// A fresh run in the same directory starts the logs again.
	loggedRun(t, straight, false, 0, 2)
	assert.Len(t, readJSONLines(t, filepath.Join(straight, "log.jsonl")), 2)
	assert.Len(t, readCSV(t, filepath.Join(straight, "log.csv")), 2)
}

// TestLogOnMainProcessOnly: on 2 ranks only the main process writes (Log needs no communication).
func TestLogOnMainProcessOnly(t *testing.T) {
	dir := t.TempDir()
	comms, err := backends.NewInProcessGroup(2)
	require.NoError(t, err)
	paths := []string{filepath.Join(dir, "rank0.jsonl"), filepath.Join(dir, "rank1.jsonl")}
	for rank, comm := range comms {
		acc, err := accel.New(accel.WithCommunicator(comm), accel.WithBackend("go"),
			accel.WithTrackers(accel.NewJSONLinesTracker(paths[rank])))
		require.NoError(t, err)
		require.NoError(t, acc.Log(1, map[string]float64{"loss": 0.5}))
		require.NoError(t, acc.Close())
	}
	assert.Equal(t, []logRow{{1, map[string]float64{"loss": 0.5}}}, readJSONLines(t, paths[0]))
	assert.NoFileExists(t, paths[1])
}

func TestLogRejectsEmptyMetrics(t *testing.T) {
	acc := newSingle(t, accel.WithTrackers(accel.NewCSVTracker(filepath.Join(t.TempDir(), "log.csv"))))
	err := acc.Log(1, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no metrics for step 1")
}

// TestLogMeanOverRanks: with MeanOverRanks the main process logs each metric's mean over the ranks; ranks
// that log different names all get an error naming them, and nothing is written.
func TestLogMeanOverRanks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mean.jsonl")
	runRanks(t, 2, []accel.Option{accel.WithTrackers(accel.NewJSONLinesTracker(path))}, func(rank int, acc *accel.Accelerator) error {
		if err := acc.Log(1, map[string]float64{"loss": float64(rank + 1), "acc": 0.5 + float64(rank)/4}, accel.MeanOverRanks()); err != nil {
			return err
		}
		if err := acc.Log(2, map[string]float64{"loss": float64(10 * (rank + 1))}); err != nil { // main's own value
			return err
		}
		name := "loss"
		if rank == 1 {
			name = "val_loss"
		}
		err := acc.Log(3, map[string]float64{name: 1}, accel.MeanOverRanks())
		if err == nil {
			return errors.New("ranks logging different names were accepted")
		}
		if !strings.Contains(err.Error(), "the ranks disagree on what Log(MeanOverRanks) records: rank 0 has step 3: loss; rank 1 has step 3: val_loss") {
			return err
		}
		return nil
	})
	assert.Equal(t, []logRow{
		{1, map[string]float64{"loss": 1.5, "acc": 0.625}},
		{2, map[string]float64{"loss": 10}},
	}, readJSONLines(t, path))
}

// TestDataLossExcludesRegularizers: DataLoss gives the loss function's value alone, while Backward returns
// it plus what the model added with train.AddLoss.
func TestDataLossExcludesRegularizers(t *testing.T) {
	acc := newSingle(t)
	const penalty = 5.0
	model, err := acc.PrepareModel(context.New(), func(ctx *context.Context, in []*graph.Node) []*graph.Node {
		train.AddLoss(ctx, graph.Const(in[0].Graph(), float32(penalty)))
		return testmodel.MLP(ctx, in)
	}, testmodel.Loss)
	require.NoError(t, err)
	inputs, labels := testmodel.Data(8, 5)
	var dataLoss float64
	loss, err := acc.Backward(model, prepare.Batch{Inputs: []*tensors.Tensor{inputs}, Labels: []*tensors.Tensor{labels}},
		accel.DataLoss(&dataLoss))
	require.NoError(t, err)
	assert.InDelta(t, penalty, loss-dataLoss, 1e-5, "loss %g, data loss %g", loss, dataLoss)
	assert.Greater(t, dataLoss, 0.0)
}
