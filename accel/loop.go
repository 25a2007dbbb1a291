package accel

import (
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/train"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/metrics"
	"github.com/goaccel/goaccel/prepare"
	"github.com/goaccel/goaccel/schedule"
	"github.com/goaccel/goaccel/userstate"
)

// Everything a training loop names, reachable from this one import: the prepared objects and their
// options (package prepare), gradient compression formats (accumulate), learning-rate schedules sized by
// the job (schedule), metrics over a sharded dataset (metrics), the program's own state in checkpoints
// (userstate) and finding checkpoints (checkpoint). The aliases are the same types, so values pass freely
// between code that imports this package and code that imports the sub-packages, which stay available to
// programs that build without the facade.

// Prepared objects and what they are built from.
type (
	// Model is a prepared model: its variables, gradient accumulators and compiled steps.
	Model = prepare.Model
	// Optimizer is a prepared optimizer: Step applies the synced gradients on every K-th micro-batch only.
	Optimizer = prepare.Optimizer
	// Scheduler sets the optimizer's learning rate before each optimizer step.
	Scheduler = prepare.Scheduler
	// DataLoader yields this process's shard of a source, batch by batch.
	DataLoader = prepare.DataLoader
	// Batch is one batch of inputs and labels.
	Batch = prepare.Batch
	// Source is an indexable dataset (Len and example access).
	Source = prepare.Source
	// ModelFn builds the model's outputs from its inputs.
	ModelFn = prepare.ModelFn
	// LossFn is a GoMLX loss function.
	LossFn = prepare.LossFn
	// MetricsFn builds in-graph metrics from labels and predictions (see TrainMetrics).
	MetricsFn = prepare.MetricsFn
	// Schedule is a learning rate per optimizer step.
	Schedule = prepare.Schedule
	// LoaderOption configures PrepareDataLoader.
	LoaderOption = prepare.LoaderOption
	// SourceOption configures TensorSource.
	SourceOption = prepare.SourceOption
	// ModelOption configures PrepareModel.
	ModelOption = prepare.ModelOption
	// OptimizerOption configures PrepareOptimizer.
	OptimizerOption = prepare.OptimizerOption
	// NonFinitePolicy says what an optimizer step does with NaN or Inf gradients (OnNonFinite).
	NonFinitePolicy = prepare.NonFinitePolicy
	// NonFiniteError is what Step returns under NonFiniteFail.
	NonFiniteError = prepare.NonFiniteError
	// MemoryError is a model refused because its training step would not fit in a process's memory; it
	// matches ErrOutOfMemory.
	MemoryError = prepare.MemoryError
	// Compression is the format gradient buckets travel in between processes (WithGradientCompression).
	Compression = accumulate.Compression
	// SizedSchedule is a schedule sized by the job's total optimizer steps (Spec.SizedSchedule).
	SizedSchedule = schedule.Sized
	// ScheduleOption configures Cosine and Linear.
	ScheduleOption = schedule.Option
	// Metric is one metric computed over the whole dataset of every process (NewMetrics).
	Metric = metrics.Metric
	// MetricSet gathers metrics across processes.
	MetricSet = metrics.Set
	// StateValue is a value of the program's own, saved and restored with checkpoints
	// (RegisterForCheckpointing).
	StateValue = userstate.Value
	// StateOption configures RegisterForCheckpointing.
	StateOption = userstate.Option
	// ResizeFunc turns the values saved by each process into one process's value on another number of
	// processes (Resize).
	ResizeFunc = userstate.ResizeFunc
)

// Non-finite gradient policies (OnNonFinite).
const (
	NonFiniteApply = prepare.NonFiniteApply
	NonFiniteFail  = prepare.NonFiniteFail
	NonFiniteSkip  = prepare.NonFiniteSkip
)

// Gradient compression formats (WithGradientCompression).
const (
	NoCompression = accumulate.NoCompression
	BF16          = accumulate.BF16
	FP16          = accumulate.FP16
)

// ErrNoCheckpoint is returned by LatestCheckpoint when a directory holds no checkpoint yet.
var ErrNoCheckpoint = checkpoint.ErrNoCheckpoint

// ErrOutOfMemory matches (errors.Is) the refusal of a model whose training step would not fit in memory,
// returned by Materialize and the first Backward before anything is allocated (FindExecutableBatchSize).
var ErrOutOfMemory = prepare.ErrOutOfMemory

// BatchSize sets the per-process batch size: one optimizer step of N processes × K micro-batches uses
// N·K·n examples.
func BatchSize(n int) LoaderOption { return prepare.BatchSize(n) }

// Shuffle shuffles every epoch, identically on every process (seed + epoch), before sharding.
func Shuffle() LoaderOption { return prepare.Shuffle() }

// DropLast drops the last incomplete batch.
func DropLast() LoaderOption { return prepare.DropLast() }

// EvenBatches (on by default) pads the last round by wrapping around so that every process yields the same
// number of batches: uneven counts would leave a process waiting in a collective.
func EvenBatches(on bool) LoaderOption { return prepare.EvenBatches(on) }

// Prefetch (on by default) gathers the next batch on another goroutine while the current one trains.
func Prefetch(on bool) LoaderOption { return prepare.Prefetch(on) }

// LoaderSeed sets the seed a loader shuffles with (by default the Accelerator's, WithSeed).
func LoaderSeed(seed uint64) LoaderOption { return prepare.Seed(seed) }

// SkipCheckpoint leaves a loader out of checkpoints (an evaluation loader): its position is neither saved
// nor expected on load.
func SkipCheckpoint() LoaderOption { return prepare.SkipCheckpoint() }

// SplitBatches makes BatchSize the global batch size, split evenly across the processes (Accelerate's
// split_batches).
func SplitBatches() LoaderOption { return prepare.SplitBatches() }

// DispatchBatches makes the main process alone read a dataset prepared with PrepareDataset and send every
// process its batch (Accelerate's dispatch_batches; see prepare.Dispatch): for a stream that cannot be read
// on every process. The other processes may pass a nil dataset.
func DispatchBatches() LoaderOption { return prepare.Dispatch() }

// TensorSource is a Source over in-memory tensors, one example per row.
func TensorSource(inputs, labels []*tensors.Tensor, opts ...SourceOption) (Source, error) {
	return prepare.TensorSource(inputs, labels, opts...)
}

// SparseLabels declares labels as class indices in [0, classes), checked as batches are read.
func SparseLabels(classes int) SourceOption { return prepare.SparseLabels(classes) }

// FromTrainModelFn adapts a GoMLX train.ModelFn (with its spec) to a ModelFn.
func FromTrainModelFn(fn train.ModelFn, spec any) ModelFn { return prepare.FromTrainModelFn(fn, spec) }

// TrainMetrics computes fn's in-graph metrics with every Backward (read them with the Metrics option).
func TrainMetrics(fn MetricsFn) ModelOption { return prepare.TrainMetrics(fn) }

// AfterStep runs fn after every optimizer step that was applied.
func AfterStep(fn func() error) OptimizerOption { return prepare.AfterStep(fn) }

// ElementWise vouches that an optimizer goaccel does not know updates each element on its own, which a
// sharding strategy needs (see prepare.ElementWise).
func ElementWise() OptimizerOption { return prepare.ElementWise() }

// ClipGradNorm clips the synced gradients to a global norm of maxNorm before every optimizer step.
func ClipGradNorm(maxNorm float64) OptimizerOption { return prepare.ClipGradNorm(maxNorm) }

// OnNonFinite says what an optimizer step does when the synced gradients hold NaN or Inf.
func OnNonFinite(policy NonFinitePolicy) OptimizerOption { return prepare.OnNonFinite(policy) }

// Cosine warms up linearly to peak over warmupSteps, then decays along a cosine to the end of the job.
func Cosine(peak float64, warmupSteps int64, opts ...ScheduleOption) SizedSchedule {
	return schedule.Cosine(peak, warmupSteps, opts...)
}

// Linear warms up linearly to peak over warmupSteps, then decays linearly to the end of the job.
func Linear(peak float64, warmupSteps int64, opts ...ScheduleOption) SizedSchedule {
	return schedule.Linear(peak, warmupSteps, opts...)
}

// MinRate sets the rate a schedule decays to (default 0).
func MinRate(rate float64) ScheduleOption { return schedule.MinRate(rate) }

// WarmupRatio gives a schedule's warm-up as a share of the job (Hugging Face's warmup_ratio): the same curve
// on any number of processes, across a resume that changes the global batch too.
func WarmupRatio(ratio float64) ScheduleOption { return schedule.WarmupRatio(ratio) }

// NewMetrics returns a set of metrics computed over every process's shard: an *Accelerator is the gatherer.
func NewMetrics(g metrics.Gatherer, ms ...Metric) *MetricSet { return metrics.New(g, ms...) }

// Accuracy is the fraction of examples whose highest logit is the label's. Ties go to the lowest class
// index, as argmax; an example whose logits hold a NaN is a miss.
func Accuracy() Metric { return metrics.Accuracy() }

// CrossEntropy is the mean sparse cross-entropy of the logits; NaN or +Inf logits give NaN.
func CrossEntropy() Metric { return metrics.CrossEntropy() }

// TopK is the fraction of examples whose label is among the k highest logits, ties going to the lower
// class index; an example whose logits hold a NaN is a miss.
func TopK(k int) Metric { return metrics.TopK(k) }

// PerRank saves a registered value of every process, each getting its own back on restore.
func PerRank() StateOption { return userstate.PerRank() }

// OptionalState lets a checkpoint lack a registered value (one added since the checkpoint was written):
// loading it leaves the value as the program set it.
func OptionalState() StateOption { return userstate.Optional() }

// Resize says how a per-process value saved on one number of processes is restored on another.
func Resize(fn ResizeFunc) StateOption { return userstate.Resize(fn) }

// LatestCheckpoint returns the newest checkpoint under dir, or ErrNoCheckpoint.
func LatestCheckpoint(dir string) (string, error) { return checkpoint.Latest(dir) }

// ListCheckpoints returns the checkpoints under dir, oldest first.
func ListCheckpoints(dir string) ([]string, error) { return checkpoint.List(dir) }
