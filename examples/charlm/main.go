// Command charlm trains a small decoder-only transformer to predict the next byte of Go's standard-library
// source, through a goaccel Accelerator. The same binary trains on one process or on several:
//
//	go run -tags blas ./examples/charlm
//	go build -tags mpi,blas -o bin/charlm ./examples/charlm && bin/accel launch -n 2 -- bin/charlm
//
// The corpus is every .go file under -data (by default $GOROOT/src, present wherever Go is), split by file
// into training and validation text. The batch size is per process: one optimizer step uses
// processes × k × batch windows of -context bytes. The main process prints progress, the validation loss
// (cross-entropy in nats per byte) and ends its output with one JSON summary line for scripts.
package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/goaccel/goaccel/accel"
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
	arch        architecture
	batch       int // per process
	k           int // micro-batches per optimizer step
	steps       int // optimizer steps
	warmup      int // optimizer steps of linear warm-up
	lr          float64
	weightDecay float64
	clip        float64 // maximum global gradient norm (0: no clipping)
	limit       int     // training windows (0: every window of the training text)
	evalWindows int     // validation windows
	seed        uint64
	dataDir     string
	quiet       bool
	// cpuProfile receives a pprof CPU profile of the training loop (not of loading or evaluation).
	cpuProfile string
}

// run is the whole program with its outside world passed in, so tests can drive it in-process.
func run(args []string, stdout, stderr io.Writer) int {
	return command.Run("charlm", args, stderr, parseFlags, func(cfg config) error { return charlm(cfg, stdout, stderr) })
}

// defaultDataDir is Go's own standard-library source: $GOROOT/src of the go command on the PATH, as `go env
// GOROOT` reports it (the GOROOT variable, when set, wins). Empty when neither says: -data is then required.
func defaultDataDir() string {
	root := os.Getenv("GOROOT")
	if root == "" {
		if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
			root = strings.TrimSpace(string(out))
		}
	}
	if root == "" {
		return ""
	}
	return filepath.Join(root, "src")
}

// parseFlags parses and validates the command line, printing what is wrong to stderr.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("charlm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.arch.context, "context", 64, "bytes per training window (the attention's reach)")
	fs.IntVar(&cfg.arch.dModel, "dmodel", 128, "model width")
	fs.IntVar(&cfg.arch.heads, "heads", 4, "attention heads (must divide -dmodel)")
	fs.IntVar(&cfg.arch.blocks, "blocks", 2, "transformer blocks")
	fs.IntVar(&cfg.batch, "batch", 32, "windows per micro-batch per process (one optimizer step uses processes × k × batch)")
	fs.IntVar(&cfg.k, "k", 1, "gradient accumulation steps: micro-batches per optimizer step")
	fs.IntVar(&cfg.steps, "steps", 100, "optimizer steps to train")
	fs.IntVar(&cfg.warmup, "warmup", 10, "optimizer steps of linear learning-rate warm-up before the cosine decay")
	fs.Float64Var(&cfg.lr, "lr", 0.002, "peak AdamW learning rate")
	fs.Float64Var(&cfg.weightDecay, "wd", 0.01, "AdamW weight decay")
	fs.Float64Var(&cfg.clip, "clip", 1.0, "clip the gradients to this global L2 norm (0: no clipping)")
	fs.IntVar(&cfg.limit, "limit", 0, "train on at most this many windows, spread over the training text (0 = all)")
	fs.IntVar(&cfg.evalWindows, "eval-windows", 256, "validation windows, spread over the validation text")
	fs.Uint64Var(&cfg.seed, "seed", 42, "seed for weight initialisation and shuffling; the same on every process")
	fs.StringVar(&cfg.dataDir, "data", defaultDataDir(), "directory whose .go files (recursively) are the corpus")
	fs.BoolVar(&cfg.quiet, "quiet", false, "no progress lines")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the training loop to this file, for `go tool pprof` (empty = none)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: charlm [flags]\n\nTrains a byte-level transformer language model on Go "+
			"source; run it under mpirun (built with -tags mpi) to train on several processes.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err // the flag package already printed it, with the usage
	}
	if fs.NArg() > 0 {
		return cfg, usageErrorf(stderr, "unexpected arguments %q", fs.Args())
	}
	a := cfg.arch
	switch {
	case a.context < 1:
		return cfg, usageErrorf(stderr, "-context must be at least 1, got %d", a.context)
	case a.dModel < 1 || a.heads < 1 || a.dModel%a.heads != 0:
		return cfg, usageErrorf(stderr, "-heads (%d) must be positive and divide -dmodel (%d)", a.heads, a.dModel)
	case a.blocks < 0:
		return cfg, usageErrorf(stderr, "-blocks must be 0 or more, got %d", a.blocks)
	case cfg.batch < 1:
		return cfg, usageErrorf(stderr, "-batch must be at least 1, got %d", cfg.batch)
	case cfg.k < 1:
		return cfg, usageErrorf(stderr, "-k must be at least 1, got %d", cfg.k)
	case cfg.steps < 1:
		return cfg, usageErrorf(stderr, "-steps must be at least 1, got %d", cfg.steps)
	case cfg.warmup < 0 || cfg.warmup > cfg.steps:
		return cfg, usageErrorf(stderr, "-warmup must be in [0, -steps], got %d", cfg.warmup)
	case !(cfg.lr > 0) || math.IsInf(cfg.lr, 0):
		return cfg, usageErrorf(stderr, "-lr must be a positive number, got %g", cfg.lr)
	case !(cfg.weightDecay >= 0) || math.IsInf(cfg.weightDecay, 0):
		return cfg, usageErrorf(stderr, "-wd must be 0 or a positive number, got %g", cfg.weightDecay)
	case !(cfg.clip >= 0) || math.IsInf(cfg.clip, 0):
		return cfg, usageErrorf(stderr, "-clip must be 0 or a positive number, got %g", cfg.clip)
	case cfg.limit < 0:
		return cfg, usageErrorf(stderr, "-limit must be 0 (all) or positive, got %d", cfg.limit)
	case cfg.evalWindows < 1:
		return cfg, usageErrorf(stderr, "-eval-windows must be at least 1, got %d", cfg.evalWindows)
	case cfg.dataDir == "":
		return cfg, usageErrorf(stderr, "-data must name a directory (no go command on the PATH tells where GOROOT is)")
	}
	return cfg, nil
}

func usageErrorf(stderr io.Writer, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	fmt.Fprintf(stderr, "charlm: %v (see -h)\n", err)
	return err
}

// charlm loads the corpus, trains, evaluates and reports. Every process runs it; only the main one prints.
func charlm(cfg config, stdout, stderr io.Writer) (err error) {
	start := time.Now()
	acc, err := accel.New(accel.WithGradientAccumulationSteps(cfg.k), accel.WithSeed(cfg.seed), accel.WithOutput(stdout))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && acc.WorldSize() > 1 {
			// Print before closing: on several processes, closing on an error ends the whole job, and this
			// process with it. The tag says who failed in mpirun's merged output.
			err = fmt.Errorf("rank %d of %d: %w", acc.Rank(), acc.WorldSize(), err)
			fmt.Fprintf(stderr, "charlm: %v\n", err)
			err = command.Printed{Err: err}
		}
		if closeErr := acc.CloseWithError(err); err == nil && closeErr != nil {
			err = closeErr
		}
	}()

	text, err := loadCorpus(cfg.dataDir)
	if err != nil {
		return err
	}
	trainSet, err := newWindowSource(text.train, cfg.arch.context, cfg.limit)
	if err != nil {
		return fmt.Errorf("training split: %w", err)
	}
	validationSet, err := newWindowSource(text.validation, cfg.arch.context, cfg.evalWindows)
	if err != nil {
		return fmt.Errorf("validation split: %w", err)
	}
	acc.Printf("corpus: %d files (%d bytes) for training, %d files (%d bytes) for validation; %d training windows "+
		"of %d bytes; %s × k=%d × batch=%d = %d windows per optimizer step\n", text.trainFiles, len(text.train),
		text.validationFiles, len(text.validation), trainSet.Len(), cfg.arch.context, processes(acc.WorldSize()),
		cfg.k, cfg.batch, acc.WorldSize()*cfg.k*cfg.batch)

	res, err := train(acc, cfg, trainSet, stdout)
	if err != nil {
		return err
	}
	validationLoss, err := evaluate(acc, res.model, validationSet)
	if err != nil {
		return err
	}
	acc.Printf("validation loss: %.4f nats per byte (%.3f bits) on %d windows\n", validationLoss,
		validationLoss/math.Ln2, validationSet.Len())
	// A diverged run still reports what it did, but fails: every process knows the global losses.
	var diverged error
	if math.IsNaN(validationLoss) || math.IsInf(validationLoss, 0) || math.IsNaN(res.finalLoss) {
		diverged = fmt.Errorf("training diverged: validation loss %g; try a smaller -lr", validationLoss)
	}
	if !acc.IsMainProcess() {
		return diverged
	}
	if err := newSummary(acc, cfg, res, validationLoss, time.Since(start)).write(stdout); err != nil {
		return err
	}
	return diverged
}

func processes(n int) string {
	if n == 1 {
		return "1 process"
	}
	return fmt.Sprintf("%d processes", n)
}
