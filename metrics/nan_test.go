package metrics_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/metrics"
)

var nan, inf = math.NaN(), math.Inf(1)

// TestRankingTiesAndNaN: a tie goes to the lowest class index, as PyTorch's argmax (and a stable sort by
// descending score) decides it, and an example whose predictions hold a NaN is a miss for every k: all-zero
// logits are class 0's, all-NaN logits or a NaN at the label's logit are nobody's.
func TestRankingTiesAndNaN(t *testing.T) {
	for _, tc := range []struct {
		name       string
		row        []float64
		label      int64
		top1, top2 float64
	}{
		{"all zero, label 0", []float64{0, 0, 0}, 0, 1, 1},
		{"all zero, label 1", []float64{0, 0, 0}, 1, 0, 1},
		{"all zero, label 2", []float64{0, 0, 0}, 2, 0, 0},
		{"tie for first, label the later", []float64{1, 5, 5}, 2, 0, 1},
		{"tie for first, label the earlier", []float64{1, 5, 5}, 1, 1, 1},
		{"tie for second", []float64{9, 5, 5}, 2, 0, 0},
		{"all NaN", []float64{nan, nan, nan}, 0, 0, 0},
		{"NaN at the label", []float64{1, nan, 0}, 1, 0, 0},
		{"NaN elsewhere", []float64{3, 1, nan}, 0, 0, 0},
		{"+Inf at the label", []float64{inf, 1, 0}, 0, 1, 1},
		{"two +Inf", []float64{1, inf, inf}, 2, 0, 1},
		{"-Inf everywhere", []float64{-inf, -inf, -inf}, 0, 1, 1},
		{"plain", []float64{0.1, 0.7, 0.2}, 2, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, want := range map[int]float64{1: tc.top1, 2: tc.top2} {
				m := metrics.TopK(k)
				if k == 1 {
					m = metrics.Accuracy()
				}
				got, err := m.Score(tc.row, 3, []int64{tc.label})
				require.NoError(t, err)
				assert.Equal(t, []float64{want}, got, "k=%d", k)
			}
		})
	}
}

// TestCrossEntropyOfNaNIsNaN: NaN or +Inf logits never give a finite loss; -Inf is a probability of 0.
func TestCrossEntropyOfNaNIsNaN(t *testing.T) {
	ce := metrics.CrossEntropy()
	for _, tc := range []struct {
		name  string
		row   []float64
		label int64
		want  float64 // NaN: NaN
	}{
		{"all NaN", []float64{nan, nan, nan}, 0, nan},
		{"NaN at the label", []float64{1, nan, 0}, 1, nan},
		{"NaN elsewhere", []float64{3, 1, nan}, 0, nan},
		{"+Inf", []float64{inf, 1, 0}, 0, nan},
		{"-Inf elsewhere", []float64{0, 0, -inf}, 0, math.Log(2)},
		{"-Inf at the label", []float64{0, 0, -inf}, 2, inf},
		{"all zero", []float64{0, 0, 0}, 1, math.Log(3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ce.Score(tc.row, 3, []int64{tc.label})
			require.NoError(t, err)
			require.Len(t, got, 1)
			if math.IsNaN(tc.want) {
				assert.True(t, math.IsNaN(got[0]), "got %g", got[0])
				return
			}
			assert.InDelta(t, tc.want, got[0], 1e-12)
		})
	}
}
