package main

import (
	"fmt"
	"math"

	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/prepare"
)

// evalBatchSize is the per-process batch for evaluation: no gradients, so larger than training's.
const evalBatchSize = 64

// evaluate returns the mean cross-entropy, in nats per byte, of the model's next-byte predictions over
// every validation window. Each process scores its shard; GatherForMetrics collects the per-window means
// and drops the windows that even batching repeated, so each window counts exactly once.
func evaluate(acc *accel.Accelerator, model *prepare.Model, validation *windowSource) (float64, error) {
	loader, err := acc.PrepareDataLoader(validation, prepare.BatchSize(evalBatchSize), prepare.SkipCheckpoint())
	if err != nil {
		return 0, err
	}
	var sum float64
	var windows int
	for batch, err := range loader.All() {
		if err != nil {
			return 0, err
		}
		logits, err := model.Predict(batch.Inputs...)
		if err != nil {
			return 0, err
		}
		losses, err := windowLosses(logits[0], batch.Labels[0])
		if err != nil {
			return 0, err
		}
		all, err := acc.GatherForMetrics(losses, batch)
		if err != nil {
			return 0, err
		}
		for _, l := range tensors.MustCopyFlatData[float64](all) {
			sum += l
		}
		windows += all.Shape().Dimensions[0]
	}
	if windows != validation.Len() {
		return 0, fmt.Errorf("evaluation counted %d windows, the validation split has %d", windows, validation.Len())
	}
	// Every window has the same number of bytes, so the mean of window means is the mean per byte.
	return sum / float64(windows), nil
}

// windowLosses returns, for logits [b, T, 256] and next bytes [b, T, 1], each window's mean cross-entropy
// (a float64 tensor [b]), computed on the host in float64 with a stable log-sum-exp.
func windowLosses(logits, labels *tensors.Tensor) (*tensors.Tensor, error) {
	ls, ys := logits.Shape(), labels.Shape()
	if ls.Rank() != 3 || ys.Rank() != 3 || ls.Dimensions[2] != vocabSize || ys.Dimensions[2] != 1 ||
		ls.Dimensions[0] != ys.Dimensions[0] || ls.Dimensions[1] != ys.Dimensions[1] {
		return nil, fmt.Errorf("scoring: logits %s and labels %s do not match [b, T, %d] and [b, T, 1]", ls, ys, vocabSize)
	}
	b, length := ls.Dimensions[0], ls.Dimensions[1]
	scores := tensors.MustCopyFlatData[float32](logits)
	next := tensors.MustCopyFlatData[int32](labels)
	out := make([]float64, b)
	for i := range b {
		var sum float64
		for t := range length {
			row := scores[(i*length+t)*vocabSize : (i*length+t+1)*vocabSize]
			top := float64(row[0])
			for _, s := range row {
				top = max(top, float64(s))
			}
			var z float64
			for _, s := range row {
				z += math.Exp(float64(s) - top)
			}
			sum += top + math.Log(z) - float64(row[next[i*length+t]])
		}
		out[i] = sum / float64(length)
	}
	return tensors.FromValue(out), nil
}
