package main

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/datasets/fashionmnist"
	"github.com/goaccel/goaccel/prepare"
)

// evalBatchSize is the per-process batch for evaluation: a forward pass needs no gradients, so it can be
// much larger than the training batch, and fewer batches mean fewer gathers.
const evalBatchSize = 500

// evaluate returns the accuracy over the whole test set. Each process scores its own shard; the
// per-example results are gathered with GatherForMetrics, which drops the examples that even batching
// repeated, so every test example counts exactly once whatever the number of processes.
func evaluate(acc *accel.Accelerator, model *prepare.Model, test *fashionmnist.Dataset) (float64, error) {
	src, err := prepare.TensorSource([]*tensors.Tensor{test.Images}, []*tensors.Tensor{test.Labels},
		prepare.SparseLabels(fashionmnist.NumClasses))
	if err != nil {
		return 0, err
	}
	// The loader is prepared here, after training started, and only by runs that evaluate: SkipCheckpoint
	// keeps it out of SaveState, so a run resumed from a checkpoint taken after an evaluation loads it
	// before evaluating again.
	loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(evalBatchSize), prepare.SkipCheckpoint())
	if err != nil {
		return 0, err
	}
	var correct, total int64
	for batch, err := range loader.All() {
		if err != nil {
			return 0, err
		}
		logits, err := model.Predict(batch.Inputs...)
		if err != nil {
			return 0, err
		}
		hits, err := correctPredictions(logits[0], batch.Labels[0])
		if err != nil {
			return 0, err
		}
		all, err := acc.GatherForMetrics(hits, batch)
		if err != nil {
			return 0, err
		}
		for _, h := range tensors.MustCopyFlatData[int32](all) {
			correct += int64(h)
		}
		total += int64(all.Shape().Dimensions[0])
	}
	if total != int64(test.Len()) {
		// GatherForMetrics must count each example once; anything else would make the accuracy a lie.
		return 0, fmt.Errorf("evaluation counted %d examples, the test set has %d", total, test.Len())
	}
	return float64(correct) / float64(total), nil
}

// correctPredictions compares the arg-max of logits [b, classes] with labels [b, 1] on the host: an int32
// tensor [b] of 1 (right) and 0 (wrong). A per-example tensor, rather than a count, is what lets
// GatherForMetrics drop padding.
func correctPredictions(logits, labels *tensors.Tensor) (*tensors.Tensor, error) {
	ls, ys := logits.Shape(), labels.Shape()
	if ls.Rank() != 2 || ys.Rank() != 2 || ys.Dimensions[1] != 1 || ls.Dimensions[0] != ys.Dimensions[0] {
		return nil, fmt.Errorf("scoring: logits %s and labels %s do not match [b, classes] and [b, 1]", ls, ys)
	}
	b, classes := ls.Dimensions[0], ls.Dimensions[1]
	scores := tensors.MustCopyFlatData[float32](logits)
	want := tensors.MustCopyFlatData[int32](labels)
	hits := make([]int32, b)
	for i := range b {
		row := scores[i*classes : (i+1)*classes]
		best := 0
		for c, s := range row {
			if s > row[best] {
				best = c
			}
		}
		if int32(best) == want[i] {
			hits[i] = 1
		}
	}
	return tensors.FromValue(hits), nil
}
