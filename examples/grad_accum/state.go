package main

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/goaccel/goaccel/userstate"
)

// runningLoss is the loop's own state that a checkpoint keeps for a resumed run to log what an
// uninterrupted one logs: this process's micro-batch losses of the optimizer step in progress (the logged
// loss is the main process's mean of them) and of the epoch so far (the epoch line and the final loss).
// Registered per process: each process has its own.
type runningLoss struct {
	stepLossSum, epochLossSum float64
	stepBatches, epochBatches int64
}

// MarshalBinary writes the four numbers as 8 bytes each: exact, NaN included.
func (r *runningLoss) MarshalBinary() ([]byte, error) {
	b := binary.BigEndian.AppendUint64(nil, math.Float64bits(r.stepLossSum))
	b = binary.BigEndian.AppendUint64(b, uint64(r.stepBatches))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.epochLossSum))
	return binary.BigEndian.AppendUint64(b, uint64(r.epochBatches)), nil
}

// UnmarshalBinary refuses anything but MarshalBinary's 32 bytes and negative counts.
func (r *runningLoss) UnmarshalBinary(b []byte) error {
	if len(b) != 32 {
		return fmt.Errorf("running loss: want 32 bytes, got %d", len(b))
	}
	stepBatches, epochBatches := int64(binary.BigEndian.Uint64(b[8:])), int64(binary.BigEndian.Uint64(b[24:]))
	if stepBatches < 0 || epochBatches < 0 {
		return fmt.Errorf("running loss: negative batch counts %d, %d", stepBatches, epochBatches)
	}
	r.stepLossSum, r.stepBatches = math.Float64frombits(binary.BigEndian.Uint64(b)), stepBatches
	r.epochLossSum, r.epochBatches = math.Float64frombits(binary.BigEndian.Uint64(b[16:])), epochBatches
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
			total.stepBatches += one.stepBatches
			total.epochLossSum += one.epochLossSum
			total.epochBatches += one.epochBatches
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
