package main

import (
	"io"
	"math"
	"time"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/examples/internal/jsonline"
	"github.com/goaccel/goaccel/version"
)

// summary is the last line the main process prints: one JSON object that scripts (the benchmarks, the
// multi-process test) parse. The counters cover training only; the PyTorch twin prints the fields the
// benchmarks read under the same names.
type summary struct {
	Rank              int    `json:"rank"`
	WorldSize         int    `json:"world_size"`
	Model             string `json:"model"`
	Width             int    `json:"width"`
	Blocks            int    `json:"blocks"`
	Parameters        int    `json:"parameters"`
	Epochs            int    `json:"epochs"`
	BatchSize         int    `json:"batch_size"` // per process
	AccumulationSteps int    `json:"accumulation_steps"`
	GlobalBatch       int    `json:"global_batch"` // examples per optimizer step: world_size × k × batch
	OptimizerSteps    int64  `json:"optimizer_steps"`
	MicroBatches      int64  `json:"micro_batches"` // on this process
	Syncs             int64  `json:"syncs"`
	CollectiveCalls   int64  `json:"collective_calls"`
	CollectiveBytes   int64  `json:"collective_bytes"`
	// ComputeSeconds is the time in compiled steps; MicroBatchComputeSeconds its part in the micro-batch
	// steps (forward, backward, accumulation), without the optimizer's updates.
	CommWaitSeconds          float64 `json:"comm_wait_seconds"`
	ComputeSeconds           float64 `json:"compute_seconds"`
	MicroBatchComputeSeconds float64 `json:"micro_batch_compute_seconds"`
	TrainExamples            int     `json:"train_examples"`
	// TestAccuracy is over the whole test set; FinalLoss the last epoch's mean training loss over every
	// process (null when this run trained no epoch).
	TestAccuracy jsonFloat `json:"test_accuracy"`
	FinalLoss    jsonFloat `json:"final_loss"`
	// TrainSeconds is the wall time of the training loop alone (no loading, compiling or evaluation), and
	// ExamplesPerSecond the job's throughput over it: every process's examples, every epoch trained.
	TrainSeconds      float64 `json:"train_seconds"`
	ExamplesPerSecond float64 `json:"examples_per_second"`
	Seconds           float64 `json:"seconds"` // wall time of the whole run
	// GoaccelVersion is the goaccel release (and commit) the program was built from.
	GoaccelVersion string `json:"goaccel_version"`
}

func newSummary(acc *accel.Accelerator, cfg config, res *trainResult, trainExamples int, accuracy float64,
	elapsed time.Duration) summary {
	stats := res.stats
	var rate float64 // a run resumed after its last epoch trained nothing
	if res.epochs > 0 {
		rate = math.Round(float64(trainExamples*res.epochs) / res.trainTime.Seconds())
	}
	return summary{
		GoaccelVersion:           version.String(),
		Rank:                     acc.Rank(),
		WorldSize:                acc.WorldSize(),
		Model:                    "resnet",
		Width:                    cfg.width,
		Blocks:                   cfg.blocks,
		Parameters:               res.parameters,
		Epochs:                   cfg.epochs,
		BatchSize:                cfg.batch,
		AccumulationSteps:        cfg.k,
		GlobalBatch:              acc.WorldSize() * cfg.k * cfg.batch,
		OptimizerSteps:           stats.OptimizerSteps,
		MicroBatches:             stats.MicroBatches,
		Syncs:                    stats.Syncs,
		CollectiveCalls:          stats.Collectives.Calls(),
		CollectiveBytes:          stats.Collectives.Bytes(),
		CommWaitSeconds:          seconds(stats.Collectives.Wait()),
		ComputeSeconds:           seconds(stats.ComputeTime),
		MicroBatchComputeSeconds: seconds(res.microBatchCompute),
		TrainExamples:            trainExamples,
		TestAccuracy:             jsonFloat(accuracy),
		FinalLoss:                jsonFloat(res.finalLoss),
		TrainSeconds:             seconds(res.trainTime),
		ExamplesPerSecond:        rate,
		Seconds:                  seconds(elapsed),
	}
}

// seconds rounds to the microsecond (jsonline.Seconds).
func seconds(d time.Duration) float64 { return jsonline.Seconds(d) }

// write prints the summary as one line of JSON.
func (s summary) write(w io.Writer) error { return jsonline.Write(w, s) }

// jsonFloat encodes NaN and ±Inf (a diverged loss) as null, so the line stays JSON.
type jsonFloat = jsonline.Float
