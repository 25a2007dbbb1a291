package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/lossplot"
)

// summary is the last line the main process prints: one JSON object that scripts (benchmarks, the
// multi-process checks) parse instead of scraping the human-readable lines above it. The counters cover
// training only: evaluation's gathers are not in them.
type summary struct {
	Rank              int       `json:"rank"`
	WorldSize         int       `json:"world_size"`
	Epochs            int       `json:"epochs"`
	BatchSize         int       `json:"batch_size"` // per process
	AccumulationSteps int       `json:"accumulation_steps"`
	GlobalBatch       int       `json:"global_batch"` // examples per optimizer step: world_size × k × batch
	OptimizerSteps    int64     `json:"optimizer_steps"`
	Syncs             int64     `json:"syncs"`
	MicroBatches      int64     `json:"micro_batches"` // on this process
	CollectiveCalls   int64     `json:"collective_calls"`
	CollectiveBytes   int64     `json:"collective_bytes"`
	CommWaitSeconds   float64   `json:"comm_wait_seconds"`
	ComputeSeconds    float64   `json:"compute_seconds"`
	TrainExamples     int       `json:"train_examples"`
	TestAccuracy      float64   `json:"test_accuracy"`
	FinalLoss         jsonFloat `json:"final_loss"` // mean training loss of the last epoch, all processes
	Model             string    `json:"model"`
	// TrainSeconds is the wall time of the training loop alone (no data loading, no evaluation), and
	// ExamplesPerSecond the job's throughput over it: every process's examples, every epoch.
	TrainSeconds      float64 `json:"train_seconds"`
	ExamplesPerSecond float64 `json:"examples_per_second"`
	Seconds           float64 `json:"seconds"` // wall time of the whole run
}

func newSummary(acc *accel.Accelerator, cfg config, stats accel.Stats, trainExamples int, accuracy, finalLoss float64,
	trainTime, elapsed time.Duration) summary {
	return summary{
		Rank:              acc.Rank(),
		WorldSize:         acc.WorldSize(),
		Epochs:            cfg.epochs,
		BatchSize:         cfg.batch,
		AccumulationSteps: cfg.k,
		GlobalBatch:       acc.WorldSize() * cfg.k * cfg.batch,
		OptimizerSteps:    stats.OptimizerSteps,
		Syncs:             stats.Syncs,
		MicroBatches:      stats.MicroBatches,
		CollectiveCalls:   stats.Collectives.Calls(),
		CollectiveBytes:   stats.Collectives.Bytes(),
		CommWaitSeconds:   seconds(stats.Collectives.Wait()),
		ComputeSeconds:    seconds(stats.ComputeTime),
		TrainExamples:     trainExamples,
		TestAccuracy:      accuracy,
		FinalLoss:         jsonFloat(finalLoss),
		Model:             cfg.model,
		TrainSeconds:      seconds(trainTime),
		ExamplesPerSecond: math.Round(float64(trainExamples*cfg.epochs) / trainTime.Seconds()),
		Seconds:           seconds(elapsed),
	}
}

// seconds rounds to the microsecond: more digits are noise and make the line harder to read.
func seconds(d time.Duration) float64 { return math.Round(d.Seconds()*1e6) / 1e6 }

// write prints the summary as one line of JSON.
func (s summary) write(w io.Writer) error {
	line, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encoding the summary: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", line)
	return err
}

// jsonFloat is a float64 that encodes NaN and ±Inf (a diverged loss) as null: encoding/json refuses
// them, and the summary line must stay valid JSON whatever training did.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(v)
}

// writeLossPlot draws the main process's per-step loss and its smoothed trend.
func writeLossPlot(path string, acc *accel.Accelerator, cfg config, stepLosses []float64) error {
	raw := lossplot.Series{Name: "train loss", X: make([]float64, len(stepLosses)), Y: stepLosses}
	if acc.WorldSize() > 1 {
		raw.Name = fmt.Sprintf("train loss (rank %d's micro-batches)", acc.Rank())
	}
	for i := range stepLosses {
		raw.X[i] = float64(i + 1)
	}
	title := fmt.Sprintf("Fashion-MNIST MLP: %s × k=%d × batch=%d, Adam lr=%g", processes(acc.WorldSize()), cfg.k,
		cfg.batch, cfg.lr)
	return lossplot.WritePNG(path, title, raw, lossplot.Smooth(raw, 0.9))
}
