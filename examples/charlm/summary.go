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
// multi-process test) parse. The counters cover training only.
type summary struct {
	Rank              int       `json:"rank"`
	WorldSize         int       `json:"world_size"`
	Processes         int       `json:"processes"`
	Model             string    `json:"model"`
	Context           int       `json:"context"`
	DModel            int       `json:"d_model"`
	Heads             int       `json:"heads"`
	Blocks            int       `json:"blocks"`
	Parameters        int       `json:"parameters"`
	BatchSize         int       `json:"batch_size"` // windows per micro-batch per process
	AccumulationSteps int       `json:"accumulation_steps"`
	GlobalBatch       int       `json:"global_batch"` // windows per optimizer step: world_size × k × batch
	Steps             int64     `json:"steps"`        // optimizer steps
	MicroBatches      int64     `json:"micro_batches"`
	Syncs             int64     `json:"syncs"`
	CollectiveCalls   int64     `json:"collective_calls"`
	CollectiveBytes   int64     `json:"collective_bytes"`
	CommWaitSeconds   float64   `json:"comm_wait_seconds"`
	ComputeSeconds    float64   `json:"compute_seconds"`
	TrainTokens       int64     `json:"train_tokens"`    // every process's predicted bytes
	TrainExamples     int64     `json:"train_examples"`  // every process's windows
	FinalLoss         jsonFloat `json:"final_loss"`      // mean training loss over the last micro-batches' examples
	ValidationLoss    jsonFloat `json:"validation_loss"` // nats per byte
	// TrainSeconds is the wall time of the training loop alone (no loading, compiling or evaluation), and
	// the rates are the job's over it.
	TrainSeconds      float64 `json:"train_seconds"`
	TokensPerSecond   float64 `json:"tokens_per_second"`
	ExamplesPerSecond float64 `json:"examples_per_second"`
	Seconds           float64 `json:"seconds"` // wall time of the whole run
	// GoaccelVersion is the goaccel release (and commit) the program was built from.
	GoaccelVersion string `json:"goaccel_version"`
}

func newSummary(acc *accel.Accelerator, cfg config, res *trainResult, validationLoss float64, elapsed time.Duration) summary {
	train, stats := res.trainTime.Seconds(), res.stats
	return summary{
		GoaccelVersion:    version.String(),
		Rank:              acc.Rank(),
		WorldSize:         acc.WorldSize(),
		Processes:         acc.WorldSize(),
		Model:             "transformer",
		Context:           cfg.arch.context,
		DModel:            cfg.arch.dModel,
		Heads:             cfg.arch.heads,
		Blocks:            cfg.arch.blocks,
		Parameters:        res.parameters,
		BatchSize:         cfg.batch,
		AccumulationSteps: cfg.k,
		GlobalBatch:       acc.WorldSize() * cfg.k * cfg.batch,
		Steps:             res.steps,
		MicroBatches:      stats.MicroBatches,
		Syncs:             stats.Syncs,
		CollectiveCalls:   stats.Collectives.Calls(),
		CollectiveBytes:   stats.Collectives.Bytes(),
		CommWaitSeconds:   seconds(stats.Collectives.Wait()),
		ComputeSeconds:    seconds(stats.ComputeTime),
		TrainTokens:       res.tokens,
		TrainExamples:     res.windows,
		FinalLoss:         jsonFloat(res.finalLoss),
		ValidationLoss:    jsonFloat(validationLoss),
		TrainSeconds:      seconds(res.trainTime),
		TokensPerSecond:   math.Round(float64(res.tokens) / train),
		ExamplesPerSecond: math.Round(float64(res.windows)/train*10) / 10,
		Seconds:           seconds(elapsed),
	}
}

// seconds rounds to the microsecond (jsonline.Seconds).
func seconds(d time.Duration) float64 { return jsonline.Seconds(d) }

// write prints the summary as one line of JSON.
func (s summary) write(w io.Writer) error { return jsonline.Write(w, s) }

// jsonFloat encodes NaN and ±Inf (a diverged loss) as null, so the line stays JSON.
type jsonFloat = jsonline.Float
