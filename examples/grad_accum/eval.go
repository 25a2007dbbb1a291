package main

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/datasets/fashionmnist"
	"github.com/goaccel/goaccel/metrics"
	"github.com/goaccel/goaccel/prepare"
)

// evalBatchSize is the per-process batch for evaluation: a forward pass needs no gradients, so it can be
// much larger than the training batch, and fewer batches mean fewer gathers.
const evalBatchSize = 500

// evaluate returns the accuracy over the whole test set. Each process scores its own shard; package metrics
// gathers the per-example results with GatherForMetrics, which drops the examples that even batching
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
	scores := metrics.New(acc, metrics.Accuracy())
	for batch, err := range loader.All() {
		if err != nil {
			return 0, err
		}
		logits, err := model.Predict(batch.Inputs...)
		if err != nil {
			return 0, err
		}
		if err := scores.Update(logits[0], batch); err != nil {
			return 0, err
		}
	}
	if scores.Count() != int64(test.Len()) {
		// GatherForMetrics must count each example once; anything else would make the accuracy a lie.
		return 0, fmt.Errorf("evaluation counted %d examples, the test set has %d", scores.Count(), test.Len())
	}
	return scores.Results()["accuracy"], nil
}
