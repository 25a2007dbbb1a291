// Command grad_accum is goaccel's demo: an MLP classifier on Fashion-MNIST trained through an Accelerator
// with gradient accumulation. The same binary trains on one process or on several:
//
//	go run ./examples/grad_accum
//	go build -tags mpi -o bin/grad_accum ./examples/grad_accum && mpirun -np 2 bin/grad_accum
//
// The batch size is per process: one optimizer step uses world_size × k × batch examples. The main process
// shows progress, prints the test accuracy and ends its output with one JSON summary line for scripts.
//
// A job that must survive a lost process saves regularly and resumes when it can, under a launcher that
// restarts it:
//
//	accel launch -n 2 --max-restarts 3 -- bin/grad_accum -checkpoints runs/exp1 -checkpoint-every 100 -resume
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/datasets/fashionmnist"
	"github.com/goaccel/goaccel/examples/internal/command"
	"github.com/goaccel/goaccel/examples/internal/cpuprofile"
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
	epochs  int
	batch   int // per process
	k       int // micro-batches per optimizer step
	lr      float64
	model   string // "mlp" or "cnn"
	hidden  int
	dataDir string
	limit   int
	seed    uint64
	plot    string
	log     string
	// checkpoints is where a checkpoint is saved after every epoch (and every checkpointEvery optimizer
	// steps); resume continues from the newest, or starts afresh when there is none yet.
	checkpoints     string
	checkpointEvery int
	resume          bool
	// stopAfterBatches ends training after that many micro-batches of this run (0: train every epoch).
	stopAfterBatches int
	// evalEachEpoch evaluates after every epoch and keeps the best accuracy.
	evalEachEpoch bool
	quiet         bool
	// cpuProfile receives a pprof CPU profile of the training loop (not of loading or evaluation).
	cpuProfile string
	// localSGD and diloco are the optimizer steps between parameter averages (0: synchronous training).
	localSGD, diloco int
}

// run is the whole program with its outside world passed in, so tests can drive it in-process.
func run(args []string, stdout, stderr io.Writer) int {
	return command.Run("grad_accum", args, stderr, parseFlags, func(cfg config) error { return demo(cfg, stdout, stderr) })
}

// parseFlags parses and validates the command line, printing what is wrong to stderr.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("grad_accum", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.epochs, "epochs", 0, "passes over the training data (0 = the model's default: 3 for mlp, 5 for cnn)")
	fs.IntVar(&cfg.batch, "batch", 64, "batch size per process (one optimizer step uses processes × k × batch examples)")
	fs.IntVar(&cfg.k, "k", 4, "gradient accumulation steps: micro-batches per optimizer step")
	fs.Float64Var(&cfg.lr, "lr", 0.002, "Adam learning rate (not rescaled for the global batch: see docs)")
	fs.StringVar(&cfg.model, "model", "mlp", "model: mlp (784→hidden→10) or cnn (two 3×3 conv layers with max-pooling, then dense)")
	fs.IntVar(&cfg.hidden, "hidden", 128, "units in the hidden dense layer")
	fs.StringVar(&cfg.dataDir, "data", fashionmnist.DefaultDir, "directory holding the Fashion-MNIST IDX files")
	fs.IntVar(&cfg.limit, "limit", 0, "use at most this many training examples (0 = all)")
	fs.Uint64Var(&cfg.seed, "seed", 42, "seed for weight initialisation and shuffling (every value, 0 included, gives a repeatable run); the same on every process")
	fs.StringVar(&cfg.plot, "plot", "", "write the training loss curve to this PNG file, drawn from the log (empty = no plot)")
	fs.StringVar(&cfg.log, "log", "", "log the loss of every optimizer step to this file: JSON Lines, or CSV if it ends in .csv "+
		"(empty = none, or beside -plot's file)")
	fs.StringVar(&cfg.checkpoints, "checkpoints", "", "save a checkpoint in this directory after every epoch (empty = none)")
	fs.IntVar(&cfg.checkpointEvery, "checkpoint-every", 0, "with -checkpoints, also save a checkpoint every `STEPS` optimizer steps (0 = after each epoch only)")
	fs.BoolVar(&cfg.resume, "resume", false, "continue from the newest checkpoint under -checkpoints, on any number of processes "+
		"(a new global batch is reported); with no checkpoint there yet, start from the beginning. Under `accel launch "+
		"--max-restarts`, a restarted job resumes this way")
	fs.IntVar(&cfg.stopAfterBatches, "stop-after-batches", 0, "stop training after `N` micro-batches of this run, saving a "+
		"checkpoint first with -checkpoints, so that a later run with -resume continues (0 = train every epoch)")
	fs.BoolVar(&cfg.evalEachEpoch, "eval-each-epoch", false, "evaluate on the test set after every epoch, log each accuracy "+
		"and report the best")
	fs.BoolVar(&cfg.quiet, "quiet", false, "no progress bar or progress lines")
	fs.IntVar(&cfg.localSGD, "local-sgd", 0, "local SGD: each process steps on its own gradients and the parameters are "+
		"averaged every `H` optimizer steps, H times fewer bytes on the wire (0 = synchronous)")
	fs.IntVar(&cfg.diloco, "diloco", 0, "DiLoCo: local SGD every `H` optimizer steps with an outer Nesterov SGD step "+
		"(lr 0.7, momentum 0.9) on the averaged update (0 = off)")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the training loop to this file, for `go tool pprof` (empty = none)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: grad_accum [flags]\n\nTrains an MLP or a CNN on Fashion-MNIST with gradient "+
			"accumulation; run it under mpirun (built with -tags mpi) to train on several processes.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err // the flag package already printed it, with the usage
	}
	if fs.NArg() > 0 {
		return cfg, usageErrorf(stderr, "unexpected arguments %q", fs.Args())
	}
	switch {
	case cfg.epochs < 0:
		return cfg, usageErrorf(stderr, "-epochs must be 0 (the model's default) or positive, got %d", cfg.epochs)
	case cfg.batch < 1:
		return cfg, usageErrorf(stderr, "-batch must be at least 1, got %d", cfg.batch)
	case cfg.k < 1:
		return cfg, usageErrorf(stderr, "-k must be at least 1, got %d", cfg.k)
	case !(cfg.lr > 0) || math.IsInf(cfg.lr, 0):
		return cfg, usageErrorf(stderr, "-lr must be a positive number, got %g", cfg.lr)
	case cfg.model != "mlp" && cfg.model != "cnn":
		return cfg, usageErrorf(stderr, "-model must be mlp or cnn, got %q", cfg.model)
	case cfg.hidden < 1:
		return cfg, usageErrorf(stderr, "-hidden must be at least 1, got %d", cfg.hidden)
	case cfg.limit < 0:
		return cfg, usageErrorf(stderr, "-limit must be 0 (all) or positive, got %d", cfg.limit)
	case cfg.dataDir == "":
		return cfg, usageErrorf(stderr, "-data must name a directory")
	case cfg.resume && cfg.checkpoints == "":
		return cfg, usageErrorf(stderr, "-resume needs -checkpoints")
	case cfg.checkpointEvery < 0:
		return cfg, usageErrorf(stderr, "-checkpoint-every must be 0 (after each epoch only) or positive, got %d", cfg.checkpointEvery)
	case cfg.checkpointEvery > 0 && cfg.checkpoints == "":
		return cfg, usageErrorf(stderr, "-checkpoint-every needs -checkpoints")
	case cfg.localSGD < 0 || cfg.diloco < 0:
		return cfg, usageErrorf(stderr, "-local-sgd and -diloco must be 0 (off) or positive")
	case cfg.localSGD > 0 && cfg.diloco > 0:
		return cfg, usageErrorf(stderr, "-local-sgd and -diloco are two modes: give one")
	case cfg.stopAfterBatches < 0:
		return cfg, usageErrorf(stderr, "-stop-after-batches must be 0 (train every epoch) or positive, got %d", cfg.stopAfterBatches)
	}
	if cfg.epochs == 0 {
		// The CNN learns more per epoch but needs a few more at the demo's global batch of 256 to pass 0.90.
		cfg.epochs = map[string]int{"mlp": 3, "cnn": 5}[cfg.model]
	}
	if cfg.plot != "" {
		if err := checkOutputFile(cfg.plot); err != nil {
			return cfg, usageErrorf(stderr, "-plot %v", err)
		}
	}
	if cfg.log != "" {
		if err := checkOutputFile(cfg.log); err != nil {
			return cfg, usageErrorf(stderr, "-log %v", err)
		}
	}
	if cfg.log == "" && cfg.plot != "" {
		// The plot is drawn from the log.
		cfg.log = strings.TrimSuffix(cfg.plot, filepath.Ext(cfg.plot)) + ".jsonl"
	}
	return cfg, nil
}

// checkWritable opens path for writing, creating it if needed, without changing what it holds (a resumed
// run's log keeps its records); a file it created is removed again, for the tracker to create.
func checkWritable(path string) error {
	_, statErr := os.Lstat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if errors.Is(statErr, fs.ErrNotExist) {
		return os.Remove(path)
	}
	return nil
}

// checkOutputFile refuses, before any training, a path that cannot become a file: a directory, or one
// whose parent directory does not exist.
func checkOutputFile(path string) error {
	if info, err := os.Stat(path); err == nil && info.IsDir() {
		return fmt.Errorf("%s is a directory: name a file", path)
	}
	if info, err := os.Stat(filepath.Dir(path)); err != nil || !info.IsDir() {
		return fmt.Errorf("%s: directory %s does not exist", path, filepath.Dir(path))
	}
	return nil
}

func usageErrorf(stderr io.Writer, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	fmt.Fprintf(stderr, "grad_accum: %v (see -h)\n", err)
	return err
}

// demo trains, evaluates and reports. Every process runs it; only the main one prints.
func demo(cfg config, stdout, stderr io.Writer) (err error) {
	start := time.Now()
	opts := []accel.Option{accel.WithGradientAccumulationSteps(cfg.k), accel.WithSeed(cfg.seed), accel.WithOutput(stdout)}
	if cfg.log != "" {
		tracker := accel.NewJSONLinesTracker(cfg.log)
		if strings.HasSuffix(cfg.log, ".csv") {
			tracker = accel.NewCSVTracker(cfg.log)
		}
		opts = append(opts, accel.WithTrackers(tracker))
	}
	if cfg.localSGD > 0 {
		opts = append(opts, accel.WithLocalSGD(cfg.localSGD))
	}
	if cfg.diloco > 0 {
		opts = append(opts, accel.WithDiLoCo(cfg.diloco, accel.DefaultOuterLearningRate, accel.DefaultOuterMomentum))
	}
	if cfg.checkpoints != "" {
		// Checked, and held for this job, when it starts rather than after the first epoch.
		opts = append(opts, accel.WithCheckpointDir(cfg.checkpoints))
	}
	acc, err := accel.New(opts...)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && acc.WorldSize() > 1 {
			// Print before closing: on several processes, closing on an error ends the whole job (the
			// others learn which rank failed and why, instead of waiting for it), and this process with it.
			// Each process's errors go to its own stderr; the tag says who failed in mpirun's merged output.
			err = fmt.Errorf("rank %d of %d: %w", acc.Rank(), acc.WorldSize(), err)
			fmt.Fprintf(stderr, "grad_accum: %v\n", err)
			err = command.Printed{Err: err}
		}
		// Under MPI, Close finalises the engine: a failure there is worth an exit code.
		if closeErr := acc.CloseWithError(err); err == nil && closeErr != nil {
			err = closeErr
		}
	}()

	if cfg.log != "" && acc.IsMainProcess() {
		// The tracker creates the log at its first record, after loading and a first optimizer step: a log
		// that cannot be written fails here, when the job starts, as -checkpoints does.
		if err := checkWritable(cfg.log); err != nil {
			return fmt.Errorf("-log: %w", err)
		}
	}

	trainSet, testSet, err := fashionmnist.Load(cfg.dataDir, fashionmnist.Limit(cfg.limit))
	if err != nil {
		return err
	}
	acc.Printf("Fashion-MNIST: %d training and %d test examples; %s × k=%d × batch=%d = %d examples per "+
		"optimizer step\n", trainSet.Len(), testSet.Len(), processes(acc.WorldSize()), cfg.k, cfg.batch,
		acc.WorldSize()*cfg.k*cfg.batch)

	// The clock starts together on every process: a process that finished loading the data later must not
	// count as training time (and the first gradient sync would make the others wait for it).
	if err := acc.WaitForEveryone(); err != nil {
		return err
	}
	stopProfile, err := cpuprofile.Start(cfg.cpuProfile, acc.Rank(), acc.WorldSize())
	if err != nil {
		return err
	}
	trainStart := time.Now()
	res, err := train(acc, cfg, trainSet, testSet, newProgress(acc, cfg.quiet, stdout))
	trainTime := time.Since(trainStart)
	if profileErr := stopProfile(); err == nil {
		err = profileErr
	}
	if err != nil {
		return err
	}
	// Everything after this point talks to the other ranks only for metrics, so the counters reported are
	// the training's alone.
	stats, microBatchCompute := acc.Stats(), res.model.ComputeTime()

	finalLoss, trained, err := res.globalLastEpochLoss(acc)
	if err != nil {
		return err
	}
	// A diverged run (every process knows the global loss, so all decide alike) reports no test accuracy:
	// it would describe a model that training destroyed, and read as a result. The summary's test_accuracy
	// is null then. A run that had nothing left to train (resumed after its last epoch) has a loss only
	// if its checkpoint kept the last epoch's.
	var diverged error
	if trained && (math.IsNaN(finalLoss) || math.IsInf(finalLoss, 0)) {
		diverged = fmt.Errorf("training diverged: the last epoch's mean loss is %g; try a smaller -lr", finalLoss)
	}
	accuracy := res.lastAccuracy
	if diverged == nil && (!cfg.evalEachEpoch || res.stoppedEarly) {
		// Evaluated once, at the end (with -eval-each-epoch, the last epoch's evaluation is the end's).
		if accuracy, err = evaluate(acc, res.model, testSet); err != nil {
			return err
		}
		if err := acc.Log(res.steps, map[string]float64{"test_accuracy": accuracy}); err != nil {
			return err
		}
		res.best.observe(accuracy, cfg.epochs)
	}
	if diverged != nil {
		accuracy = math.NaN()
		acc.Printf("test accuracy: not reported, training diverged\n")
	} else {
		acc.Printf("test accuracy: %.4f on %d examples\n", accuracy, testSet.Len())
	}
	if cfg.evalEachEpoch {
		acc.Printf("best test accuracy: %.4f, after epoch %d\n", res.best.accuracy, res.best.epoch)
	}
	if cfg.plot != "" && acc.IsMainProcess() {
		if err := writeLossPlot(cfg.plot, acc, cfg); err != nil {
			return err
		}
		acc.Printf("loss curve written to %s\n", cfg.plot)
	}
	// A diverged run still reports what it did (final_loss and test_accuracy are null in the summary), but
	// it failed: scripts must not take its exit code for success.
	if !acc.IsMainProcess() {
		return diverged
	}
	s := newSummary(acc, cfg, stats, microBatchCompute, trainSet.Len(), accuracy, res.best.accuracy, finalLoss, trainTime, time.Since(start))
	if err := s.write(stdout); err != nil {
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
