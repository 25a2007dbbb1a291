package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/examples/internal/jsonline"
	"github.com/goaccel/goaccel/examples/internal/lossplot"
	"github.com/goaccel/goaccel/version"
)

// summary is the last line the main process prints: one JSON object that scripts (benchmarks, the
// multi-process checks) parse instead of scraping the human-readable lines above it. The counters cover
// training only: evaluation's gathers are not in them.
type summary struct {
	Rank              int     `json:"rank"`
	WorldSize         int     `json:"world_size"`
	Epochs            int     `json:"epochs"`
	BatchSize         int     `json:"batch_size"` // per process
	AccumulationSteps int     `json:"accumulation_steps"`
	GlobalBatch       int     `json:"global_batch"` // examples per optimizer step: world_size × k × batch
	OptimizerSteps    int64   `json:"optimizer_steps"`
	Syncs             int64   `json:"syncs"`
	MicroBatches      int64   `json:"micro_batches"` // on this process
	CollectiveCalls   int64   `json:"collective_calls"`
	CollectiveBytes   int64   `json:"collective_bytes"`
	CommWaitSeconds   float64 `json:"comm_wait_seconds"`
	ComputeSeconds    float64 `json:"compute_seconds"`
	// MicroBatchComputeSeconds is the part of ComputeSeconds spent in the micro-batch steps (forward,
	// backward and the accumulation into the gradient buckets), without the optimizer's updates: divided by
	// MicroBatches, what one micro-batch's forward and backward cost on this process.
	MicroBatchComputeSeconds float64 `json:"micro_batch_compute_seconds"`
	TrainExamples            int     `json:"train_examples"`
	// TestAccuracy is null for a diverged run, which is not evaluated.
	TestAccuracy     jsonFloat `json:"test_accuracy"`
	BestTestAccuracy float64   `json:"best_test_accuracy"` // the best epoch's with -eval-each-epoch
	// RestartCount is how many times `accel launch --max-restarts` restarted the job before this run.
	RestartCount int `json:"restart_count"`
	// FinalLoss is the mean training loss over the last epoch's examples, all processes; null when it is
	// not a number (a diverged run) or when there is none (a run resumed after its last epoch from a
	// checkpoint that does not keep it).
	FinalLoss jsonFloat `json:"final_loss"`
	Model     string    `json:"model"`
	// TrainSeconds is the wall time of the training loop alone (no data loading, no evaluation), and
	// ExamplesPerSecond the job's throughput over it: every process's examples, every epoch.
	TrainSeconds      float64 `json:"train_seconds"`
	ExamplesPerSecond float64 `json:"examples_per_second"`
	Seconds           float64 `json:"seconds"` // wall time of the whole run
	// GoaccelVersion is the goaccel release (and commit) the program was built from.
	GoaccelVersion string `json:"goaccel_version"`
	// ComputeThreads is the threads this process computed with: its share of its machine's processors
	// (cpu.Kernels.Threads).
	ComputeThreads int `json:"compute_threads"`
	// Sharding is the strategy the training state was split with, OptimizerStateBytes the optimizer state
	// this process held (1/N of the replicated size under optimizer or gradients sharding).
	Sharding            string `json:"sharding"`
	OptimizerStateBytes int64  `json:"optimizer_state_bytes"`
	// CommHook names what carried the gradients ("identity", "bf16 compression", "powersgd(…)"), and
	// CompressionRatio is what a plain all-reduce would have sent over what was sent (PowerSGD; 1 otherwise).
	CommHook         string  `json:"comm_hook"`
	CompressionRatio float64 `json:"compression_ratio"`
	// Mode says what the processes exchange: "synchronous" (gradients every step) or local SGD's or
	// DiLoCo's configuration; ParameterAverages counts local SGD's averages of the parameters.
	Mode              string `json:"mode"`
	ParameterAverages int64  `json:"parameter_averages"`
	// OverlappedBuckets counts the buckets whose all-reduce started inside a step (GOACCEL_OVERLAP=1).
	OverlappedBuckets int64 `json:"overlapped_buckets"`
	// OverlapDoneInStep counts those whose all-reduce had completed when their step returned, and
	// OverlapInStepSeconds is the time they had inside their steps, summed over buckets.
	OverlapDoneInStep    int64   `json:"overlap_done_in_step"`
	OverlapInStepSeconds float64 `json:"overlap_in_step_seconds"`
}

func newSummary(acc *accel.Accelerator, cfg config, stats accel.Stats, microBatchCompute time.Duration, trainExamples int,
	accuracy, best, finalLoss float64, trainTime, elapsed time.Duration) summary {
	return summary{
		GoaccelVersion:           version.String(),
		ComputeThreads:           cpu.CurrentKernels().Threads,
		Rank:                     acc.Rank(),
		WorldSize:                acc.WorldSize(),
		Epochs:                   cfg.epochs,
		BatchSize:                cfg.batch,
		AccumulationSteps:        cfg.k,
		GlobalBatch:              acc.WorldSize() * cfg.k * cfg.batch,
		OptimizerSteps:           stats.OptimizerSteps,
		Syncs:                    stats.Syncs,
		MicroBatches:             stats.MicroBatches,
		CollectiveCalls:          stats.Collectives.Calls(),
		CollectiveBytes:          stats.Collectives.Bytes(),
		CommWaitSeconds:          seconds(stats.Collectives.Wait()),
		ComputeSeconds:           seconds(stats.ComputeTime),
		MicroBatchComputeSeconds: seconds(microBatchCompute),
		TrainExamples:            trainExamples,
		TestAccuracy:             jsonFloat(accuracy),
		BestTestAccuracy:         best,
		RestartCount:             acc.RestartCount(),
		FinalLoss:                jsonFloat(finalLoss),
		Model:                    cfg.model,
		TrainSeconds:             seconds(trainTime),
		ExamplesPerSecond:        math.Round(float64(trainExamples*cfg.epochs) / trainTime.Seconds()),
		Seconds:                  seconds(elapsed),
		Sharding:                 stats.Sharding,
		OptimizerStateBytes:      stats.OptimizerStateBytes,
		CommHook:                 acc.CommHookName(),
		CompressionRatio:         math.Round(stats.CommHook.Ratio()*1000) / 1000,
		Mode:                     stats.Mode,
		ParameterAverages:        stats.ParameterAverages,
		OverlappedBuckets:        stats.Overlap.Buckets,
		OverlapDoneInStep:        stats.Overlap.DoneInStep,
		OverlapInStepSeconds:     seconds(stats.Overlap.InStep),
	}
}

// seconds rounds to the microsecond (jsonline.Seconds).
func seconds(d time.Duration) float64 { return jsonline.Seconds(d) }

// write prints the summary as one line of JSON.
func (s summary) write(w io.Writer) error { return jsonline.Write(w, s) }

// jsonFloat encodes NaN and ±Inf (a diverged loss) as null, so the line stays JSON.
type jsonFloat = jsonline.Float

// writeLossPlot draws the main process's per-step loss, read back from the log, and its smoothed trend.
func writeLossPlot(path string, acc *accel.Accelerator, cfg config) error {
	raw, err := readLossLog(cfg.log)
	if err != nil {
		return fmt.Errorf("plotting the loss: %w", err)
	}
	raw.Name = "train loss"
	if acc.WorldSize() > 1 {
		raw.Name = fmt.Sprintf("train loss (rank %d's micro-batches)", acc.Rank())
	}
	title := fmt.Sprintf("Fashion-MNIST MLP: %s × k=%d × batch=%d, Adam lr=%g", processes(acc.WorldSize()), cfg.k,
		cfg.batch, cfg.lr)
	return lossplot.WritePNG(path, title, raw, lossplot.Smooth(raw, 0.9))
}

// readLossLog reads the steps that logged a loss from a JSON Lines or CSV log.
func readLossLog(path string) (lossplot.Series, error) {
	var s lossplot.Series
	data, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	add := func(step, loss float64) { s.X, s.Y = append(s.X, step), append(s.Y, loss) }
	if strings.HasSuffix(path, ".csv") {
		records, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
		if err != nil || len(records) == 0 {
			return s, fmt.Errorf("%s is not a CSV log: %v", path, err)
		}
		lossColumn := slices.Index(records[0], "loss")
		if lossColumn < 1 {
			return s, fmt.Errorf("%s has no loss column", path)
		}
		for _, rec := range records[1:] {
			step, err1 := strconv.ParseFloat(rec[0], 64)
			loss, err2 := strconv.ParseFloat(rec[lossColumn], 64)
			if err1 == nil && err2 == nil {
				add(step, loss)
			}
		}
		return s, nil
	}
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var rec struct {
			Step float64  `json:"step"`
			Loss *float64 `json:"loss"`
		}
		if err := json.Unmarshal(line, &rec); err != nil {
			return s, fmt.Errorf("%s: %w", path, err)
		}
		if rec.Loss != nil {
			add(rec.Step, *rec.Loss)
		}
	}
	return s, nil
}
