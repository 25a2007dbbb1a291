package accel_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/userstate"
)

// TestWeightedMean: the mean over the ranks weighted by each rank's examples, and their total; a rank of
// weight 0 contributes nothing (not even its NaN); weights that sum to 0 give NaN; a negative weight is an
// error on every rank.
func TestWeightedMean(t *testing.T) {
	runRanks(t, 3, nil, func(rank int, acc *accel.Accelerator) error {
		value, weight := []float64{1, 4, math.NaN()}[rank], []float64{3, 1, 0}[rank]
		mean, total, err := acc.WeightedMean(value, weight)
		if err != nil {
			return err
		}
		if mean != (1*3+4*1)/4.0 || total != 4 {
			return fmt.Errorf("weighted mean %g of total weight %g, want 1.75 of 4", mean, total)
		}
		if mean, total, err = acc.WeightedMean(value, 0); err != nil || !math.IsNaN(mean) || total != 0 {
			return fmt.Errorf("no weight: mean %g, total %g, error %v; want NaN, 0, nil", mean, total, err)
		}
		_, _, err = acc.WeightedMean(1, []float64{1, -1, 1}[rank])
		if err == nil || !strings.Contains(err.Error(), "1 rank(s) gave a negative or NaN weight") {
			return fmt.Errorf("a negative weight on rank 1: %v", err)
		}
		return nil
	})
	acc := newSingle(t)
	mean, total, err := acc.WeightedMean(0.25, 8)
	require.NoError(t, err)
	assert.Equal(t, 0.25, mean)
	assert.Equal(t, 8.0, total)
}

// TestLogWeightedBy: with WeightedBy the main process logs each metric's mean over the ranks weighted by
// each rank's examples; weights that sum to 0 and ranks logging different names are errors on every rank,
// and nothing is written for them.
func TestLogWeightedBy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "weighted.jsonl")
	runRanks(t, 2, []accel.Option{accel.WithTrackers(accel.NewJSONLinesTracker(path))}, func(rank int, acc *accel.Accelerator) error {
		// Rank 0 averaged 6 examples to a loss of 1, rank 1 two examples to 3: 12/8 over the 8 examples.
		metrics := map[string]float64{"loss": []float64{1, 3}[rank], "accuracy": []float64{0.5, 1}[rank]}
		if err := acc.Log(1, metrics, accel.WeightedBy([]float64{6, 2}[rank])); err != nil {
			return err
		}
		if err := acc.Log(2, metrics, accel.WeightedBy(0)); err == nil || !strings.Contains(err.Error(), "sum to 0") {
			return fmt.Errorf("weights summing to 0: %v", err)
		}
		name := map[bool]string{true: "loss", false: "val_loss"}[rank == 0]
		err := acc.Log(3, map[string]float64{name: 1}, accel.WeightedBy(1))
		if err == nil || !strings.Contains(err.Error(), "the ranks disagree on what Log(WeightedBy) records") {
			return fmt.Errorf("ranks logging different names: %v", err)
		}
		return nil
	})
	assert.Equal(t, []logRow{{1, map[string]float64{"loss": 1.5, "accuracy": 0.625}}}, readJSONLines(t, path))
}

// epochLoss is a loop's running loss of the epoch: this process's Σ loss × examples and its examples.
// Registered per process; on another number of processes the sums move to the main process.
type epochLoss struct{ sum, examples float64 }

func (e *epochLoss) MarshalBinary() ([]byte, error) {
	b := binary.BigEndian.AppendUint64(nil, math.Float64bits(e.sum))
	return binary.BigEndian.AppendUint64(b, math.Float64bits(e.examples)), nil
}

func (e *epochLoss) UnmarshalBinary(b []byte) error {
	if len(b) != 16 {
		return errors.New("epoch loss: want 16 bytes")
	}
	e.sum, e.examples = math.Float64frombits(binary.BigEndian.Uint64(b)), math.Float64frombits(binary.BigEndian.Uint64(b[8:]))
	return nil
}

var epochLossOntoMain = userstate.Resize(func(saved [][]byte, rank, _ int) ([]byte, error) {
	var total epochLoss
	for _, data := range saved {
		var one epochLoss
		if err := one.UnmarshalBinary(data); err != nil {
			return nil, err
		}
		if rank == 0 {
			total.sum, total.examples = total.sum+one.sum, total.examples+one.examples
		}
	}
	return total.MarshalBinary()
})

// epochLosses is an epoch's training loss two ways, over every rank: weighted by examples, and the plain
// mean of the micro-batches' losses.
type epochLosses struct{ weighted, perMicroBatch float64 }

// trainEpochLoss runs one epoch of the resizable job on s (resuming from dir when load is set, stopping and
// saving into dir after stopAfter micro-batches when it is > 0), and returns rank 0's view of its losses.
func trainEpochLoss(t *testing.T, s shape, dir string, load bool, stopAfter int) epochLosses {
	t.Helper()
	var res epochLosses
	var mu sync.Mutex
	opts := []accel.Option{accel.WithGradientAccumulationSteps(s.k), accel.WithSeed(11)}
	runRanks(t, s.ranks, opts, func(rank int, acc *accel.Accelerator) error {
		r := prepareResumableWith(t, acc, testmodel.SGD, resizeExamples, s.b, 1)
		weighted, plain := &epochLoss{}, &epochLoss{} // plain: Σ loss, micro-batches
		if err := acc.RegisterForCheckpointing("weighted", weighted, userstate.PerRank(), epochLossOntoMain); err != nil {
			return err
		}
		if err := acc.RegisterForCheckpointing("plain", plain, userstate.PerRank(), epochLossOntoMain); err != nil {
			return err
		}
		if load {
			if err := acc.LoadState(dir); err != nil {
				return err
			}
		}
		ran := 0
		for batch, err := range r.loader.All() {
			if err != nil {
				return err
			}
			var loss float64
			err = acc.Accumulate(func() error {
				var err error
				if loss, err = acc.Backward(r.model, batch); err != nil {
					return err
				}
				if _, err := r.opt.Step(); err != nil {
					return err
				}
				return r.opt.ZeroGrad()
			})
			if err != nil {
				return err
			}
			n := float64(batch.Size())
			weighted.sum, weighted.examples = weighted.sum+loss*n, weighted.examples+n
			plain.sum, plain.examples = plain.sum+loss, plain.examples+1
			if ran++; ran == stopAfter {
				_, err := acc.SaveState(dir)
				return err
			}
		}
		mean, _, err := acc.WeightedMean(weighted.sum/weighted.examples, weighted.examples)
		if err != nil {
			return err
		}
		perMicroBatch, _, err := acc.WeightedMean(plain.sum/plain.examples, plain.examples)
		if rank == 0 {
			mu.Lock()
			res = epochLosses{mean, perMicroBatch}
			mu.Unlock()
		}
		return err
	})
	return res
}

// TestEpochLossAcrossAResize: an epoch's loss weighted by examples (WeightedMean over Σ loss × examples)
// is the same, within 1e-5, for a run that never stopped and one resumed in the middle of the epoch on
// another number of processes with the same global batch (1×2×4 → 2×2×2, 2×2×2 → 1×2×4, 2×1×4 → 4×1×2):
// the same examples trained on the same weights. The mean of the micro-batches' losses differs between
// them, since the resumed part's batches are of another size.
func TestEpochLossAcrossAResize(t *testing.T) {
	for _, tc := range []struct {
		from, to  shape
		stopAfter int
	}{
		{shape{1, 2, 4}, shape{2, 2, 2}, 4}, // 16 of the epoch's 48 examples
		{shape{2, 2, 2}, shape{1, 2, 4}, 4},
		{shape{2, 1, 4}, shape{4, 1, 2}, 3}, // 24
	} {
		t.Run(fmt.Sprintf("%v to %v", tc.from, tc.to), func(t *testing.T) {
			require.Equal(t, tc.from.global(), tc.to.global())
			dir := t.TempDir()
			straight := trainEpochLoss(t, tc.from, "", false, 0)
			trainEpochLoss(t, tc.from, dir, false, tc.stopAfter)
			resumed := trainEpochLoss(t, tc.to, dir, true, 0)
			assert.InDelta(t, straight.weighted, resumed.weighted, 1e-5)
			assert.Greater(t, math.Abs(straight.perMicroBatch-resumed.perMicroBatch), 1e-4,
				"control: the mean over micro-batches of unequal sizes moves")
			t.Logf("weighted by examples: %.6f and %.6f; per micro-batch: %.6f and %.6f", straight.weighted,
				resumed.weighted, straight.perMicroBatch, resumed.perMicroBatch)
		})
	}
}
