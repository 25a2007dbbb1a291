package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/goaccel/goaccel/userstate"
)

// runningLoss is the loop's own state that a checkpoint keeps for a resumed run to log what an
// uninterrupted one logs: this process's losses of the optimizer step in progress (the logged loss is the
// main process's mean of them) and of the epoch so far (the epoch line and the final loss). Each sum adds
// a micro-batch's loss times its examples, and the examples are counted beside it: the means are over
// examples, so a resumed run whose batches have another size (another number of processes, the same
// global batch) weighs each example as the uninterrupted run did, where a mean of the micro-batches'
// losses would weigh each micro-batch alike. Registered per process: each process has its own.
type runningLoss struct {
	stepLossSum, epochLossSum   float64
	stepExamples, epochExamples int64
}

// runningLossFormat leads the bytes: earlier versions of the demo saved 32 bytes that counted micro-batches
// instead of examples, which cannot be turned into these sums.
const runningLossFormat = 2

// add counts a micro-batch whose mean loss over its examples is loss.
func (r *runningLoss) add(loss float64, examples int) {
	weighted := loss * float64(examples)
	r.stepLossSum, r.stepExamples = r.stepLossSum+weighted, r.stepExamples+int64(examples)
	r.epochLossSum, r.epochExamples = r.epochLossSum+weighted, r.epochExamples+int64(examples)
}

// stepLoss and epochLoss are the means over the examples counted (NaN with none).
func (r *runningLoss) stepLoss() float64  { return meanOf(r.stepLossSum, r.stepExamples) }
func (r *runningLoss) epochLoss() float64 { return meanOf(r.epochLossSum, r.epochExamples) }

func meanOf(sum float64, examples int64) float64 {
	if examples == 0 {
		return math.NaN()
	}
	return sum / float64(examples)
}

// MarshalBinary writes the format and the four numbers as 8 bytes each: exact, NaN included.
func (r *runningLoss) MarshalBinary() ([]byte, error) {
	b := binary.BigEndian.AppendUint64(nil, runningLossFormat)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.stepLossSum))
	b = binary.BigEndian.AppendUint64(b, uint64(r.stepExamples))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.epochLossSum))
	return binary.BigEndian.AppendUint64(b, uint64(r.epochExamples)), nil
}

// UnmarshalBinary refuses anything but MarshalBinary's 40 bytes (a checkpoint of an earlier version of the
// demo by name) and negative counts.
func (r *runningLoss) UnmarshalBinary(b []byte) error {
	if len(b) == 32 {
		return errors.New("running loss: saved by an earlier version of the demo, which counted micro-batches " +
			"instead of examples; resume with that version, or start afresh")
	}
	if len(b) != 40 {
		return fmt.Errorf("running loss: want 40 bytes, got %d", len(b))
	}
	if format := binary.BigEndian.Uint64(b); format != runningLossFormat {
		return fmt.Errorf("running loss: format %d, this version reads %d", format, runningLossFormat)
	}
	stepExamples, epochExamples := int64(binary.BigEndian.Uint64(b[16:])), int64(binary.BigEndian.Uint64(b[32:]))
	if stepExamples < 0 || epochExamples < 0 {
		return fmt.Errorf("running loss: negative example counts %d, %d", stepExamples, epochExamples)
	}
	r.stepLossSum, r.stepExamples = math.Float64frombits(binary.BigEndian.Uint64(b[8:])), stepExamples
	r.epochLossSum, r.epochExamples = math.Float64frombits(binary.BigEndian.Uint64(b[24:])), epochExamples
	return nil
}

// sumIntoMainProcess registers sumRunningLoss as the running loss's Resize.
var sumIntoMainProcess = userstate.Resize(sumRunningLoss)

// sumRunningLoss moves the running sums of a checkpoint saved by another number of processes onto the new
// main process, the others starting from zero: the job's totals, which the final loss averages, stay
// whole. (At the optimizer-step boundary such a checkpoint was saved at, the step sums are zero.)
func sumRunningLoss(saved [][]byte, rank, worldSize int) ([]byte, error) {
	var total runningLoss
	if rank == 0 {
		for r, data := range saved {
			var one runningLoss
			if err := one.UnmarshalBinary(data); err != nil {
				return nil, fmt.Errorf("saved rank %d: %w", r, err)
			}
			total.stepLossSum += one.stepLossSum
			total.stepExamples += one.stepExamples
			total.epochLossSum += one.epochLossSum
			total.epochExamples += one.epochExamples
		}
	}
	return total.MarshalBinary()
}

// bestAccuracy is the best test accuracy so far and the epoch that reached it (-eval-each-epoch): the same
// on every process, since every process gets the whole test set's result.
type bestAccuracy struct {
	accuracy float64
	epoch    int64
}

func (b *bestAccuracy) observe(accuracy float64, epoch int) {
	if accuracy > b.accuracy || b.epoch == 0 {
		b.accuracy, b.epoch = accuracy, int64(epoch)
	}
}

func (b *bestAccuracy) MarshalBinary() ([]byte, error) {
	out := binary.BigEndian.AppendUint64(nil, math.Float64bits(b.accuracy))
	return binary.BigEndian.AppendUint64(out, uint64(b.epoch)), nil
}

func (b *bestAccuracy) UnmarshalBinary(data []byte) error {
	if len(data) != 16 {
		return fmt.Errorf("best accuracy: want 16 bytes, got %d", len(data))
	}
	accuracy, epoch := math.Float64frombits(binary.BigEndian.Uint64(data)), int64(binary.BigEndian.Uint64(data[8:]))
	if accuracy < 0 || accuracy > 1 || epoch < 0 {
		return fmt.Errorf("best accuracy: %g at epoch %d is not an accuracy", accuracy, epoch)
	}
	b.accuracy, b.epoch = accuracy, epoch
	return nil
}
