// Command resnet trains a small residual network on Fashion-MNIST through goaccel's Accelerator: residual
// blocks of convolution, batch normalization and ReLU, a strided block with a projection shortcut, global
// average pooling, dropout and a dense head (model.go), with Adam. The same binary trains on one process or
// on several:
//
//	go run -tags blas ./examples/resnet
//	go build -tags mpi,blas -o bin/resnet ./examples/resnet && bin/accel launch -n 2 -- bin/resnet
//
// The batch size is per process: one optimizer step uses processes × k × batch examples. The main process
// prints a line per epoch and the test accuracy, and ends its output with one JSON summary line for
// scripts. -checkpoints saves after every epoch and -resume continues from the newest checkpoint.
//
// internal/bench/pytorch/resnet_ddp.py is the same model and training in PyTorch; `make bench` compares
// the two (docs/benchmarks-method.md).
package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/datasets/fashionmnist"
	"github.com/goaccel/goaccel/examples/internal/command"
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

// config is the command line.
type config struct {
	arch
	epochs  int
	batch   int // per process
	k       int // micro-batches per optimizer step
	lr      float64
	dataDir string
	limit   int
	seed    uint64
	quiet   bool
	// checkpoints is where a checkpoint is saved after every epoch; resume continues from the newest.
	checkpoints string
	resume      bool
	// cpuProfile receives a pprof CPU profile of the training loop (not of loading or evaluation).
	cpuProfile string
}

// run is the whole program with its outside world passed in, so tests can drive it in-process.
func run(args []string, stdout, stderr io.Writer) int {
	return command.Run("resnet", args, stderr, parseFlags, func(cfg config) error { _, err := job(cfg, stdout); return err })
}

// parseFlags parses and validates the command line, printing what is wrong to stderr.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("resnet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.epochs, "epochs", 3, "passes over the training data")
	fs.IntVar(&cfg.batch, "batch", 64, "batch size per process (one optimizer step uses processes × k × batch examples)")
	fs.IntVar(&cfg.k, "k", 1, "gradient accumulation steps: micro-batches per optimizer step")
	fs.Float64Var(&cfg.lr, "lr", 0.002, "Adam learning rate")
	fs.IntVar(&cfg.width, "width", 16, "channels of the first stage (the second has twice as many)")
	fs.IntVar(&cfg.blocks, "blocks", 1, "residual blocks per stage")
	fs.Float64Var(&cfg.dropout, "dropout", 0.2, "dropout rate before the dense head")
	fs.StringVar(&cfg.dataDir, "data", fashionmnist.DefaultDir, "directory holding the Fashion-MNIST IDX files")
	fs.IntVar(&cfg.limit, "limit", 0, "use at most this many training examples (0 = all)")
	fs.Uint64Var(&cfg.seed, "seed", 42, "seed for weight initialisation, dropout and shuffling; the same on every process")
	fs.BoolVar(&cfg.quiet, "quiet", false, "no per-epoch lines")
	fs.StringVar(&cfg.checkpoints, "checkpoints", "", "save a checkpoint in this directory after every epoch (empty = none)")
	fs.BoolVar(&cfg.resume, "resume", false, "continue from the newest checkpoint under -checkpoints (none yet: start afresh)")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the training loop to this file, for `go tool pprof` (empty = none)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: resnet [flags]\n\nTrains a small ResNet on Fashion-MNIST; run it under "+
			"`accel launch -n N` (built with -tags mpi) to train on several processes.\n\n")
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
	case cfg.batch < 2:
		// Batch normalization divides by the batch's variance: one example has none.
		return cfg, usageErrorf(stderr, "-batch must be at least 2 (batch normalization needs a batch), got %d", cfg.batch)
	case cfg.k < 1:
		return cfg, usageErrorf(stderr, "-k must be at least 1, got %d", cfg.k)
	case !(cfg.lr > 0) || math.IsInf(cfg.lr, 0):
		return cfg, usageErrorf(stderr, "-lr must be a positive number, got %g", cfg.lr)
	case cfg.width < 1:
		return cfg, usageErrorf(stderr, "-width must be at least 1, got %d", cfg.width)
	case cfg.blocks < 1:
		return cfg, usageErrorf(stderr, "-blocks must be at least 1, got %d", cfg.blocks)
	case !(cfg.dropout >= 0 && cfg.dropout < 1):
		return cfg, usageErrorf(stderr, "-dropout must be in [0, 1), got %g", cfg.dropout)
	case cfg.limit < 0:
		return cfg, usageErrorf(stderr, "-limit must be 0 (all) or positive, got %d", cfg.limit)
	case cfg.dataDir == "":
		return cfg, usageErrorf(stderr, "-data must name a directory")
	case cfg.resume && cfg.checkpoints == "":
		return cfg, usageErrorf(stderr, "-resume needs -checkpoints")
	}
	return cfg, nil
}

func usageErrorf(stderr io.Writer, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	fmt.Fprintf(stderr, "resnet: %v (see -h)\n", err)
	return err
}

// job trains, evaluates and reports; every process runs it and only the main one prints. It returns this
// process's summary (the main process also printed it).
func job(cfg config, stdout io.Writer) (s summary, err error) {
	start := time.Now()
	opts := []accel.Option{accel.WithGradientAccumulationSteps(cfg.k), accel.WithSeed(cfg.seed), accel.WithOutput(stdout)}
	if cfg.checkpoints != "" {
		opts = append(opts, accel.WithCheckpointDir(cfg.checkpoints)) // checked and held from the start
	}
	acc, err := accel.New(opts...)
	if err != nil {
		return s, err
	}
	defer func() {
		if err != nil && acc.WorldSize() > 1 {
			// The tag says who failed in mpirun's merged output.
			err = fmt.Errorf("rank %d of %d: %w", acc.Rank(), acc.WorldSize(), err)
		}
		// On several processes, closing on an error ends the whole job instead of leaving the others in a
		// collective; under MPI a failure to finalise is worth an exit code too.
		if closeErr := acc.CloseWithError(err); err == nil && closeErr != nil {
			err = closeErr
		}
	}()

	trainSet, testSet, err := fashionmnist.Load(cfg.dataDir, fashionmnist.Limit(cfg.limit))
	if err != nil {
		return s, err
	}
	acc.Printf("Fashion-MNIST: %d training and %d test examples; %s × k=%d × batch=%d = %d examples per "+
		"optimizer step\n", trainSet.Len(), testSet.Len(), processes(acc.WorldSize()), cfg.k, cfg.batch,
		acc.WorldSize()*cfg.k*cfg.batch)
	res, err := train(acc, cfg, trainSet)
	if err != nil {
		return s, err
	}
	accuracy, err := evaluate(acc, res.model, testSet)
	if err != nil {
		return s, err
	}
	acc.Printf("test accuracy: %.4f on %d examples\n", accuracy, testSet.Len())
	s = newSummary(acc, cfg, res, trainSet.Len(), accuracy, time.Since(start))
	if acc.IsMainProcess() {
		err = s.write(stdout)
	}
	return s, err
}

func processes(n int) string {
	if n == 1 {
		return "1 process"
	}
	return fmt.Sprintf("%d processes", n)
}
