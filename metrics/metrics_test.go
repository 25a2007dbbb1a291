package metrics_test

import (
	"math"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/metrics"
	"github.com/goaccel/goaccel/prepare"
)

// logits are 7 examples' predictions over 3 classes, and labels their classes: examples 0, 2, 3 and 6 are
// right (top-1), example 1's label is second (top-2), example 5's second too, example 4's last.
var (
	logits = [][]float32{{3, 1, 0}, {2, 1, 0}, {0, 5, 1}, {0, 0, 9}, {4, 2, 1}, {1, 3, 2}, {8, 0, 0}}
	labels = [][]int32{{0}, {1}, {1}, {2}, {2}, {2}, {0}}
)

// want are the metrics over the 7 examples, worked out by hand.
func want() map[string]float64 {
	ce := 0.0
	for i, row := range logits {
		var sum float64
		for _, v := range row {
			sum += math.Exp(float64(v))
		}
		ce += math.Log(sum) - float64(row[labels[i][0]])
	}
	return map[string]float64{"accuracy": 4.0 / 7, "top_2_accuracy": 6.0 / 7, "cross_entropy": ce / 7}
}

func source(t *testing.T) prepare.Source {
	src, err := prepare.TensorSource([]*tensors.Tensor{tensors.FromValue(logits)}, []*tensors.Tensor{tensors.FromValue(labels)})
	require.NoError(t, err)
	return src
}

// score runs the metrics over the source on one rank of acc: the inputs are the predictions.
func score(acc *accel.Accelerator, src prepare.Source) (map[string]float64, int64, error) {
	loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(2))
	if err != nil {
		return nil, 0, err
	}
	scores := metrics.New(acc, metrics.Accuracy(), metrics.TopK(2), metrics.CrossEntropy())
	for batch, err := range loader.All() {
		if err != nil {
			return nil, 0, err
		}
		if err := scores.Update(batch.Inputs[0], batch); err != nil {
			return nil, 0, err
		}
	}
	return scores.Results(), scores.Count(), nil
}

// TestMetricsOnOneAndTwoRanks: 7 examples in batches of 2 leave 2 ranks an uneven last round, which even
// batching pads with repeated examples; the gathered metrics count every example once and equal the
// hand-computed ones on 1 and 2 ranks.
func TestMetricsOnOneAndTwoRanks(t *testing.T) {
	for _, ranks := range []int{1, 2} {
		comms, err := backends.NewInProcessGroup(ranks)
		require.NoError(t, err)
		results := make([]map[string]float64, ranks)
		counts := make([]int64, ranks)
		errs := make([]error, ranks)
		var wg sync.WaitGroup
		for r := range ranks {
			wg.Go(func() {
				acc, err := accel.New(accel.WithCommunicator(comms[r]), accel.WithBackend("go"))
				if err != nil {
					errs[r] = err
					return
				}
				defer acc.Close()
				results[r], counts[r], errs[r] = score(acc, source(t))
			})
		}
		wg.Wait()
		for r := range ranks {
			require.NoError(t, errs[r], "%d ranks, rank %d", ranks, r)
			assert.EqualValues(t, 7, counts[r], "%d ranks, rank %d: every example once", ranks, r)
			for name, v := range want() {
				assert.InDelta(t, v, results[r][name], 1e-6, "%d ranks, rank %d: %s", ranks, r, name)
			}
		}
	}
}

// TestMetricErrors: bad shapes, dtypes and labels are errors naming the problem.
func TestMetricErrors(t *testing.T) {
	acc, err := accel.New(accel.WithBackend("go"))
	require.NoError(t, err)
	defer acc.Close()
	batch := func(labels *tensors.Tensor) prepare.Batch {
		return prepare.Batch{Labels: []*tensors.Tensor{labels}, Indices: []int{0, 1}}
	}
	tests := []struct {
		name        string
		metric      metrics.Metric
		predictions *tensors.Tensor
		batch       prepare.Batch
		want        string
	}{
		{"predictions not a matrix", metrics.Accuracy(), tensors.FromValue([]float32{1, 2}), batch(tensors.FromValue([]int32{0, 1})), "[batch, classes]"},
		{"label out of range", metrics.Accuracy(), tensors.FromValue([][]float32{{1, 2}, {2, 1}}), batch(tensors.FromValue([]int32{0, 5})), "label 5 of example 1 is not one of 2 classes"},
		{"float labels", metrics.Accuracy(), tensors.FromValue([][]float32{{1, 2}, {2, 1}}), batch(tensors.FromValue([]float32{0, 1})), "class labels must be integers"},
		{"k too large", metrics.TopK(3), tensors.FromValue([][]float32{{1, 2}, {2, 1}}), batch(tensors.FromValue([]int32{0, 1})), "k must be in [1, 2]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := metrics.New(acc, tc.metric).Update(tc.predictions, tc.batch)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
