// Command lstm trains a small LSTM (GoMLX's layers/lstm) to continue sines, through goaccel's Accelerator:
// from -length samples of a sine of random frequency and phase, the model predicts the next sample. An LSTM
// of -hidden units reads the sequence, and a dense layer maps its last hidden state to the prediction; Adam
// minimises the mean squared error. The examples are drawn from -seed (data.go), so that a run is
// repeatable and the PyTorch twin trains on the same data. The same binary trains on one process or on
// several:
//
//	go run -tags blas ./examples/lstm
//	go build -tags mpi,blas -o bin/lstm ./examples/lstm && bin/accel launch -n 2 -- bin/lstm
//
// The batch size is per process: one optimizer step uses processes × batch examples. The main process
// prints a line per epoch (not with -quiet) and ends its output with one JSON summary line for scripts:
// among others train_examples, epochs, examples_per_second (over the training loop alone) and final_loss
// (the last epoch's mean training loss).
//
// internal/bench/pytorch/lstm_sine.py is the same model and training in PyTorch (torch.nn.LSTM); `make
// bench` compares the two (docs/benchmarks-method.md).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/lstm"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/examples/internal/command"
	"github.com/goaccel/goaccel/examples/internal/jsonline"
	"github.com/goaccel/goaccel/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes of run.
const (
	exitOK    = command.OK
	exitError = command.Error
	exitUsage = command.Usage
)

// adamEpsilon is PyTorch's Adam default (GoMLX's Adam defaults to 1e-7), as the twin uses it.
const adamEpsilon = 1e-8

// config is the command line.
type config struct {
	epochs   int
	batch    int // per process
	examples int // training sequences
	length   int // samples per input sequence
	hidden   int // LSTM units
	lr       float64
	seed     uint64
	quiet    bool
}

// run is the whole program with its outside world passed in, so tests can drive it in-process.
func run(args []string, stdout, stderr io.Writer) int {
	return command.Run("lstm", args, stderr, parseFlags, func(cfg config) error { _, err := job(cfg, stdout); return err })
}

// parseFlags parses and validates the command line, printing what is wrong to stderr.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("lstm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.epochs, "epochs", 10, "passes over the training sequences")
	fs.IntVar(&cfg.batch, "batch", 32, "batch size per process (one optimizer step uses processes × batch sequences)")
	fs.IntVar(&cfg.examples, "examples", 2048, "training sequences, drawn from -seed")
	fs.IntVar(&cfg.length, "length", 16, "samples per input sequence")
	fs.IntVar(&cfg.hidden, "hidden", 32, "LSTM units")
	fs.Float64Var(&cfg.lr, "lr", 0.01, "Adam learning rate")
	fs.Uint64Var(&cfg.seed, "seed", 42, "seed of the data, the initial weights and the shuffling; the same on every process")
	fs.BoolVar(&cfg.quiet, "quiet", false, "no per-epoch lines")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: lstm [flags]\n\nTrains an LSTM to continue sines; run it under `accel "+
			"launch -n N` (built with -tags mpi) to train on several processes.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err // the flag package already printed it, with the usage
	}
	switch {
	case fs.NArg() > 0:
		return cfg, usageErrorf(stderr, "unexpected arguments %q", fs.Args())
	case cfg.epochs < 1:
		return cfg, usageErrorf(stderr, "-epochs must be at least 1, got %d", cfg.epochs)
	case cfg.batch < 1:
		return cfg, usageErrorf(stderr, "-batch must be at least 1, got %d", cfg.batch)
	case cfg.examples < 1:
		return cfg, usageErrorf(stderr, "-examples must be at least 1, got %d", cfg.examples)
	case cfg.length < 1:
		return cfg, usageErrorf(stderr, "-length must be at least 1, got %d", cfg.length)
	case cfg.hidden < 1:
		return cfg, usageErrorf(stderr, "-hidden must be at least 1, got %d", cfg.hidden)
	case !(cfg.lr > 0) || math.IsInf(cfg.lr, 0):
		return cfg, usageErrorf(stderr, "-lr must be a positive number, got %g", cfg.lr)
	}
	return cfg, nil
}

func usageErrorf(stderr io.Writer, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	fmt.Fprintf(stderr, "lstm: %v (see -h)\n", err)
	return err
}

// sineLSTM reads the sequence [batch, length, 1] with an LSTM and predicts the next sample [batch, 1] from its
// last hidden state. Its weights start from GoMLX's default initializer, which the twin reproduces.
func sineLSTM(hidden int) func(ctx *context.Context, inputs []*graph.Node) []*graph.Node {
	return func(ctx *context.Context, inputs []*graph.Node) []*graph.Node {
		_, last, _ := lstm.New(ctx.In("lstm"), inputs[0], hidden).Done() // [1, batch, hidden]
		h := graph.Reshape(last, -1, hidden)
		return []*graph.Node{layers.Dense(ctx.In("output"), h, true, 1)}
	}
}

// summary is the last line the main process prints: one JSON object that scripts (the benchmarks) parse.
// The PyTorch twin prints the fields the benchmarks read under the same names.
type summary struct {
	Rank           int    `json:"rank"`
	WorldSize      int    `json:"world_size"`
	Model          string `json:"model"`
	Hidden         int    `json:"hidden"`
	SequenceLength int    `json:"sequence_length"`
	Parameters     int    `json:"parameters"`
	Epochs         int    `json:"epochs"`
	BatchSize      int    `json:"batch_size"`   // per process
	GlobalBatch    int    `json:"global_batch"` // examples per optimizer step: world_size × batch
	OptimizerSteps int64  `json:"optimizer_steps"`
	TrainExamples  int    `json:"train_examples"`
	// FirstLoss and FinalLoss are the first and the last epoch's mean training loss (mean squared error)
	// over every process's batches.
	FirstLoss jsonline.Float `json:"first_loss"`
	FinalLoss jsonline.Float `json:"final_loss"`
	// TrainSeconds is the wall time of the training loop alone (no data generation or compiling), and
	// ExamplesPerSecond the job's throughput over it: every process's examples, every epoch.
	TrainSeconds      float64 `json:"train_seconds"`
	ExamplesPerSecond float64 `json:"examples_per_second"`
	Seconds           float64 `json:"seconds"` // wall time of the whole run
	GoaccelVersion    string  `json:"goaccel_version"`
}

// job trains and reports; every process runs it and only the main one prints. It returns this process's
// summary (the main process also printed it).
func job(cfg config, stdout io.Writer) (s summary, err error) {
	start := time.Now()
	acc, err := accel.New(accel.WithSeed(cfg.seed), accel.WithOutput(stdout))
	if err != nil {
		return s, err
	}
	defer func() {
		if err != nil && acc.WorldSize() > 1 {
			err = fmt.Errorf("rank %d of %d: %w", acc.Rank(), acc.WorldSize(), err)
		}
		// On several processes, closing on an error ends the whole job instead of leaving the others in a
		// collective.
		if closeErr := acc.CloseWithError(err); err == nil && closeErr != nil {
			err = closeErr
		}
	}()

	x, y := sineData(cfg.examples, cfg.length, cfg.seed)
	ctx := context.New()
	ctx.SetParam(context.ParamInitialSeed, int64(cfg.seed))
	src, err := accel.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	if err != nil {
		return s, err
	}
	p, err := acc.Prepare(accel.Spec{
		Context: ctx, Model: sineLSTM(cfg.hidden), Loss: losses.MeanSquaredError,
		Optimizer:        optimizers.Adam().LearningRate(cfg.lr).Epsilon(adamEpsilon).Done(),
		OptimizerOptions: []accel.OptimizerOption{accel.OnNonFinite(accel.NonFiniteFail)},
		// Whole batches only: every step has the compiled shape.
		Loaders: []accel.LoaderSpec{{Source: src, Options: []accel.LoaderOption{accel.BatchSize(cfg.batch), accel.Shuffle(),
			accel.DropLast()}}},
	})
	if err != nil {
		return s, err
	}
	model, opt, loader := p.Model, p.Optimizer, p.Loaders[0]
	// Build and compile the model before the clock starts: compiling is not training throughput.
	first, err := loader.PeekBatch()
	if err == nil {
		err = model.Materialize(first)
	}
	if err != nil {
		return s, err
	}
	parameters := 0
	for _, v := range model.Parameters() {
		parameters += v.Shape().Size()
	}
	acc.Printf("LSTM of %d units on sequences of %d samples, %d training sequences: %d parameters\n", cfg.hidden,
		cfg.length, cfg.examples, parameters)

	if err := acc.WaitForEveryone(); err != nil { // the clock starts together on every process
		return s, err
	}
	trainStart := time.Now()
	var epochLosses []float64 // each epoch's loss sum and batch count on this process
	trained := 0              // examples, every process's, every epoch
	for epoch := range cfg.epochs {
		loader.SetEpoch(epoch) // every process shuffles alike, so the shards stay disjoint
		var sum float64
		batches := 0
		for batch, err := range loader.All() {
			if err != nil {
				return s, err
			}
			loss, err := acc.Backward(model, batch)
			if err == nil {
				_, err = opt.Step()
			}
			if err == nil {
				err = opt.ZeroGrad()
			}
			if nonFinite := new(accel.NonFiniteError); errors.As(err, &nonFinite) {
				return s, fmt.Errorf("training diverged at optimizer step %d: %w; try a smaller -lr", nonFinite.Step, err)
			}
			if err != nil {
				return s, fmt.Errorf("epoch %d, batch %d: %w", epoch+1, batch.Step+1, err)
			}
			sum += loss
			batches++
			trained += batch.Valid * acc.WorldSize()
		}
		epochLosses = append(epochLosses, sum, float64(batches))
		if !cfg.quiet {
			acc.Printf("epoch %d/%d: mean train loss %.6f%s\n", epoch+1, cfg.epochs, sum/float64(max(batches, 1)),
				rankNote(acc))
		}
	}
	trainTime := time.Since(trainStart)
	// The job's mean losses: one small all-reduce after training.
	total, err := acc.Reduce(tensors.FromValue(epochLosses), accel.Sum)
	if err != nil {
		return s, fmt.Errorf("averaging the losses: %w", err)
	}
	sums := tensors.MustCopyFlatData[float64](total)
	epochLoss := func(epoch int) jsonline.Float {
		return jsonline.Float(sums[2*epoch] / math.Max(sums[2*epoch+1], 1))
	}
	s = summary{
		Rank: acc.Rank(), WorldSize: acc.WorldSize(), Model: "lstm", Hidden: cfg.hidden, SequenceLength: cfg.length,
		Parameters: parameters, Epochs: cfg.epochs, BatchSize: cfg.batch, GlobalBatch: acc.WorldSize() * cfg.batch,
		OptimizerSteps: opt.Steps(), TrainExamples: trained / cfg.epochs,
		FirstLoss: epochLoss(0), FinalLoss: epochLoss(cfg.epochs - 1),
		TrainSeconds:      jsonline.Seconds(trainTime),
		ExamplesPerSecond: math.Round(float64(trained) / trainTime.Seconds()),
		Seconds:           jsonline.Seconds(time.Since(start)),
		GoaccelVersion:    version.String(),
	}
	acc.Printf("final loss %.6f (first epoch %.6f), %.0f examples/s\n", float64(s.FinalLoss), float64(s.FirstLoss),
		s.ExamplesPerSecond)
	if acc.IsMainProcess() {
		err = jsonline.Write(stdout, s)
	}
	return s, err
}

// rankNote qualifies per-process numbers printed by the main process when there are several processes.
func rankNote(acc *accel.Accelerator) string {
	if acc.WorldSize() == 1 {
		return ""
	}
	return fmt.Sprintf(" (rank %d's shard)", acc.Rank())
}
