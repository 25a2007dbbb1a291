// Package metrics scores a model's predictions over a dataset sharded across processes: accuracy, top-k
// accuracy and mean cross-entropy, each counted once per example of the dataset whatever the number of
// processes. Each rank scores its own batches example by example, and the per-example scores are gathered
// with the accelerator's GatherForMetrics, which drops the examples that even batching repeated (a batch's
// mean could not be corrected for them). Every rank gets the same results.
//
//	scores := metrics.New(acc, metrics.Accuracy(), metrics.CrossEntropy())
//	for batch, err := range loader.All() {
//		out, err := model.Predict(batch.Inputs...)
//		err = scores.Update(out[0], batch)
//	}
//	results := scores.Results() // {"accuracy": 0.91, "cross_entropy": 0.27}
package metrics

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/internal/classlabels"
	"github.com/goaccel/goaccel/prepare"
)

// Gatherer gathers a per-example tensor of a batch from every rank, without the padded duplicates:
// accel.Accelerator's GatherForMetrics.
type Gatherer interface {
	GatherForMetrics(t *tensors.Tensor, batch prepare.Batch) (*tensors.Tensor, error)
}

// Metric scores each example of a batch from the model's predictions for it ([batch, classes] logits or
// probabilities) and its label ([batch] or [batch, 1] class indices).
type Metric interface {
	Name() string
	// Score returns one value per example; the metric's result is their mean over the dataset.
	Score(predictions []float64, classes int, labels []int64) ([]float64, error)
}

// Set accumulates metrics over batches.
type Set struct {
	gatherer Gatherer
	metrics  []Metric
	sums     []float64
	count    int64
}

// New returns an empty set of metrics gathered through g (the accelerator).
func New(g Gatherer, ms ...Metric) *Set {
	return &Set{gatherer: g, metrics: ms, sums: make([]float64, len(ms))}
}

// Update scores batch's predictions on this rank and adds every rank's scores (gathered, without padded
// duplicates) to the totals. Collective: every rank calls it for each of its batches.
func (s *Set) Update(predictions *tensors.Tensor, batch prepare.Batch) error {
	if len(batch.Labels) == 0 {
		return errors.New("metrics: the batch has no labels")
	}
	scores, b, err := s.score(predictions, batch.Labels[0])
	if err != nil {
		return err
	}
	all, err := s.gatherer.GatherForMetrics(tensors.FromFlatDataAndDimensions(scores, b, len(s.metrics)), batch)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	flat := tensors.MustCopyFlatData[float64](all)
	for i, v := range flat {
		s.sums[i%len(s.metrics)] += v
	}
	s.count += int64(all.Shape().Dimensions[0])
	return nil
}

// score computes this rank's [b, metrics] scores, row-major.
func (s *Set) score(predictions, labels *tensors.Tensor) ([]float64, int, error) {
	if predictions == nil || labels == nil {
		return nil, 0, errors.New("metrics: nil predictions or labels")
	}
	ps, ls := predictions.Shape(), labels.Shape()
	if ps.Rank() != 2 {
		return nil, 0, fmt.Errorf("metrics: predictions must be [batch, classes], got %s", ps)
	}
	b, classes := ps.Dimensions[0], ps.Dimensions[1]
	if ls.Size() != b || ls.Dimensions[0] != b {
		return nil, 0, fmt.Errorf("metrics: labels %s do not hold one class per example of predictions %s", ls, ps)
	}
	values, err := asFloat64(predictions)
	if err != nil {
		return nil, 0, err
	}
	classOf, err := classlabels.Int64s(labels)
	if err != nil {
		return nil, 0, fmt.Errorf("metrics: %w", err)
	}
	scores := make([]float64, b*len(s.metrics))
	for m, metric := range s.metrics {
		perExample, err := metric.Score(values, classes, classOf)
		if err != nil {
			return nil, 0, fmt.Errorf("metrics: %s: %w", metric.Name(), err)
		}
		for i, v := range perExample {
			scores[i*len(s.metrics)+m] = v
		}
	}
	return scores, b, nil
}

// Results are each metric's mean over every example seen, by name.
func (s *Set) Results() map[string]float64 {
	out := make(map[string]float64, len(s.metrics))
	for m, metric := range s.metrics {
		out[metric.Name()] = s.sums[m] / float64(max(s.count, 1))
	}
	return out
}

// Count is the number of examples scored, each counted once across the ranks.
func (s *Set) Count() int64 { return s.count }

// Accuracy is the fraction of examples whose highest prediction is their label. A tie goes to the lowest
// class index, as PyTorch's argmax decides it (all-equal predictions pick class 0), and an example whose
// predictions hold a NaN is a miss whatever its label: a model that produced NaN predicted nothing.
func Accuracy() Metric { return topK{k: 1, name: "accuracy"} }

// TopK is the fraction of examples whose label is among their k highest predictions, ranked as Accuracy
// ranks the highest: ties broken by lower class index, and an example whose predictions hold a NaN a miss
// (a NaN is never in the top k, and the other classes of such an example are not a ranking either).
func TopK(k int) Metric { return topK{k: k, name: fmt.Sprintf("top_%d_accuracy", k)} }

type topK struct {
	k    int
	name string
}

func (t topK) Name() string { return t.name }

func (t topK) Score(predictions []float64, classes int, labels []int64) ([]float64, error) {
	if t.k < 1 || t.k > classes {
		return nil, fmt.Errorf("k must be in [1, %d], got %d", classes, t.k)
	}
	hits := make([]float64, len(labels))
	for i, label := range labels {
		if label < 0 || label >= int64(classes) {
			return nil, fmt.Errorf("label %d of example %d is not one of %d classes", label, i, classes)
		}
		row := predictions[i*classes : (i+1)*classes]
		if slices.ContainsFunc(row, math.IsNaN) {
			continue // a miss
		}
		// The label's place in the ranking: the classes that score higher, and those that score the same
		// with a lower index (a stable sort by descending score puts them first).
		ahead := 0
		for j, v := range row {
			if v > row[label] || v == row[label] && j < int(label) {
				ahead++
			}
		}
		if ahead < t.k {
			hits[i] = 1
		}
	}
	return hits, nil
}

// CrossEntropy is the mean negative log-likelihood of the labels under the softmax of the predictions
// (logits), as losses.SparseCategoricalCrossEntropyLogits, example by example. An example whose logits hold
// a NaN or a +Inf scores NaN, and so does the mean over a dataset that has one such example: a diverged
// model's loss is never a finite number. A -Inf logit is a probability of 0: +Inf when it is the label's.
func CrossEntropy() Metric { return crossEntropy{} }

type crossEntropy struct{}

func (crossEntropy) Name() string { return "cross_entropy" }

func (crossEntropy) Score(logits []float64, classes int, labels []int64) ([]float64, error) {
	losses := make([]float64, len(labels))
	for i, label := range labels {
		if label < 0 || label >= int64(classes) {
			return nil, fmt.Errorf("label %d of example %d is not one of %d classes", label, i, classes)
		}
		row := logits[i*classes : (i+1)*classes]
		top := slices.Max(row)
		var sum float64
		for _, v := range row {
			sum += math.Exp(v - top)
		}
		losses[i] = math.Log(sum) + top - row[label]
	}
	return losses, nil
}

// asFloat64 reads float predictions.
func asFloat64(t *tensors.Tensor) ([]float64, error) {
	var out []float64
	err := t.ConstFlatData(func(flat any) {
		switch f := flat.(type) {
		case []float32:
			out = make([]float64, len(f))
			for i, v := range f {
				out[i] = float64(v)
			}
		case []float64:
			out = slices.Clone(f)
		}
	})
	if err == nil && out == nil && t.Shape().Size() > 0 {
		err = fmt.Errorf("metrics: predictions must be float32 or float64, got %s", t.DType())
	}
	return out, err
}
