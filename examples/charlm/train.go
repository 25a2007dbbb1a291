package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/examples/internal/cpuprofile"
	"github.com/goaccel/goaccel/prepare"
)

// adamEpsilon is PyTorch's AdamW default (GoMLX's Adam defaults to 1e-7).
const adamEpsilon = 1e-8

// trainResult is what training leaves for evaluation and the report.
type trainResult struct {
	model      *prepare.Model
	steps      int64
	parameters int
	// tokens and windows are the job's: every process's micro-batches, counted once.
	tokens, windows int64
	// finalLoss is the mean training loss over the examples of the last micro-batches, all processes.
	finalLoss float64
	// trainTime is the wall time of the training loop alone, started together on every process.
	trainTime time.Duration
	// stats are the accelerator's counters at the end of the loop, before the counts' all-reduce.
	stats accel.Stats
}

// lossWindow is how many of the last micro-batches per process the final training loss averages.
const lossWindow = 20

// train runs the user's loop: Prepare, then Accumulate, Backward, ClipGradNorm, Step and ZeroGrad on
// every micro-batch, until the optimizer took cfg.steps steps (over as many passes of the training
// windows as that takes).
func train(acc *accel.Accelerator, cfg config, data prepare.Source, stdout io.Writer) (*trainResult, error) {
	ctx := context.New()
	ctx.SetParam(context.ParamInitialSeed, int64(cfg.seed))
	model, err := acc.PrepareModel(ctx, transformer(cfg.arch), nextByteLoss)
	if err != nil {
		return nil, err
	}
	adamW := optimizers.Adam().LearningRate(cfg.lr).WeightDecay(cfg.weightDecay).Epsilon(adamEpsilon).Done()
	// A diverged step (NaN or Inf gradients) ends the run with an error instead of training on garbage.
	opt, err := acc.PrepareOptimizer(model, adamW, prepare.OnNonFinite(prepare.NonFiniteFail))
	if err != nil {
		return nil, err
	}
	if _, err := acc.PrepareScheduler(opt, warmupCosine(cfg.lr, int64(cfg.warmup), int64(cfg.steps))); err != nil {
		return nil, err
	}
	loader, err := acc.PrepareDataLoader(data, prepare.BatchSize(cfg.batch), prepare.Shuffle())
	if err != nil {
		return nil, err
	}
	if loader.Len() == 0 {
		return nil, fmt.Errorf("%d training windows leave process %d none: lower -batch or raise -limit", data.Len(), acc.Rank())
	}
	// Build the model before the clock starts: compiling is not training throughput.
	first, err := loader.PeekBatch()
	if err != nil {
		return nil, err
	}
	if err := model.Materialize(first); err != nil {
		return nil, err
	}
	res := &trainResult{model: model}
	for _, v := range model.Parameters() {
		res.parameters += v.Shape().Size()
	}
	acc.Printf("transformer: %d blocks, d_model %d, %d heads, context %d: %d parameters\n", cfg.arch.blocks,
		cfg.arch.dModel, cfg.arch.heads, cfg.arch.context, res.parameters)

	// The clock starts together on every process.
	if err := acc.WaitForEveryone(); err != nil {
		return nil, err
	}
	stopProfile, err := cpuprofile.Start(cfg.cpuProfile, acc.Rank(), acc.WorldSize())
	if err != nil {
		return nil, err
	}
	defer func() { _ = stopProfile() }()
	start := time.Now()
	// recent are this process's last micro-batches: each one's loss (the mean over its examples) and its
	// number of examples, which weighs it in the final loss, a mean over examples.
	type microBatch struct{ loss, examples float64 }
	var recent []microBatch
	var localWindows int64
	report := max(cfg.steps/10, 1)
	for epoch := 0; opt.Steps() < int64(cfg.steps); epoch++ {
		loader.SetEpoch(epoch)
		for batch, err := range loader.All() {
			if err != nil {
				return nil, err
			}
			var loss float64
			var stepped bool
			err = acc.Accumulate(func() error {
				var err error
				if loss, err = acc.Backward(model, batch); err != nil {
					return err
				}
				// A no-op on micro-batches that do not sync.
				if cfg.clip > 0 {
					if _, err := acc.ClipGradNorm(model, cfg.clip); err != nil {
						return err
					}
				}
				if stepped, err = opt.Step(); err != nil {
					return err
				}
				return opt.ZeroGrad()
			})
			if nonFinite := new(prepare.NonFiniteError); errors.As(err, &nonFinite) {
				return nil, fmt.Errorf("training diverged at optimizer step %d: %w; try a smaller -lr", nonFinite.Step, err)
			}
			if err != nil {
				return nil, fmt.Errorf("epoch %d, batch %d: %w", epoch+1, batch.Step+1, err)
			}
			localWindows += int64(batch.Valid)
			if recent = append(recent, microBatch{loss, float64(batch.Size())}); len(recent) > lossWindow {
				recent = recent[1:]
			}
			if stepped && !cfg.quiet && (opt.Steps()%int64(report) == 0 || opt.Steps() == 1) {
				acc.Printf("step %d/%d: train loss %.4f%s, %s\n", opt.Steps(), cfg.steps, loss, rankNote(acc),
					time.Since(start).Round(time.Millisecond))
			}
			// Every process steps together (each step is a collective), so all leave at the same batch.
			if opt.Steps() >= int64(cfg.steps) {
				break
			}
		}
	}
	res.trainTime = time.Since(start)
	if err := stopProfile(); err != nil {
		return nil, err
	}
	res.stats = acc.Stats()
	// One cheap collective proves that every process ends with the same weights before they are evaluated.
	if err := acc.CheckReplicas(model); err != nil {
		return nil, err
	}
	res.steps = opt.Steps()
	var lossSum, examples float64
	for _, mb := range recent {
		lossSum, examples = lossSum+mb.loss*mb.examples, examples+mb.examples
	}
	total, err := acc.Reduce(tensors.FromValue([]float64{float64(localWindows), lossSum, examples}), accel.Sum)
	if err != nil {
		return nil, fmt.Errorf("summing the training counts: %w", err)
	}
	sums := tensors.MustCopyFlatData[float64](total)
	if sums[2] == 0 {
		return nil, errors.New("no micro-batch was trained")
	}
	res.windows = int64(sums[0])
	res.tokens = res.windows * int64(cfg.arch.context)
	res.finalLoss = sums[1] / sums[2]
	return res, nil
}

// rankNote qualifies per-process numbers printed by the main process when there are several processes.
func rankNote(acc *accel.Accelerator) string {
	if acc.WorldSize() == 1 {
		return ""
	}
	return fmt.Sprintf(" (rank %d's micro-batch)", acc.Rank())
}
