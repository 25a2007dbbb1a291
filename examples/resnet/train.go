package main

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/datasets/fashionmnist"
	"github.com/goaccel/goaccel/examples/internal/cpuprofile"
)

// adamEpsilon is PyTorch's Adam default (GoMLX's Adam defaults to 1e-7), as the twin uses it.
const adamEpsilon = 1e-8

// trainResult is what training leaves for evaluation and the report.
type trainResult struct {
	model      *accel.Model
	parameters int
	// epochs is the number of epochs this run trained (a resumed run skips those its checkpoint holds).
	epochs int
	// finalLoss is the mean training loss of the last epoch over every process's micro-batches: NaN when
	// this run trained none (resumed after its last epoch).
	finalLoss float64
	// trainTime is the wall time of the training loop alone, started together on every process.
	trainTime time.Duration
	// stats are the accelerator's counters at the end of the loop.
	stats accel.Stats
	// microBatchCompute is the time spent in the compiled micro-batch steps (forward and backward).
	microBatchCompute time.Duration
}

// train runs the user's loop: Prepare, then Accumulate around Backward, Step and ZeroGrad on every
// micro-batch (Step and ZeroGrad do nothing until k micro-batches were accumulated), a checkpoint after
// every epoch with -checkpoints.
func train(acc *accel.Accelerator, cfg config, data *fashionmnist.Dataset) (*trainResult, error) {
	ctx := context.New()
	// Rank 0's initial weights are broadcast to the others; the seed makes runs repeatable.
	ctx.SetParam(context.ParamInitialSeed, int64(cfg.seed))
	src, err := accel.TensorSource([]*tensors.Tensor{data.Images}, []*tensors.Tensor{data.Labels},
		accel.SparseLabels(fashionmnist.NumClasses))
	if err != nil {
		return nil, err
	}
	p, err := acc.Prepare(accel.Spec{
		Context: ctx, Model: resnet(cfg.arch), Loss: losses.SparseCategoricalCrossEntropyLogits,
		Optimizer: optimizers.Adam().LearningRate(cfg.lr).Epsilon(adamEpsilon).Done(),
		// A diverged step (NaN or Inf gradients) ends the run instead of training on garbage.
		OptimizerOptions: []accel.OptimizerOption{accel.OnNonFinite(accel.NonFiniteFail)},
		Loaders:          []accel.LoaderSpec{{Source: src, Options: []accel.LoaderOption{accel.BatchSize(cfg.batch), accel.Shuffle()}}},
	})
	if err != nil {
		return nil, err
	}
	model, opt, loader := p.Model, p.Optimizer, p.Loaders[0]
	if loader.Len() == 0 {
		return nil, fmt.Errorf("%d training examples leave process %d no batch: lower -batch or raise -limit", data.Len(), acc.Rank())
	}
	// Build and compile the model before the clock starts: compiling is not training throughput.
	first, err := loader.PeekBatch()
	if err != nil {
		return nil, err
	}
	if err := model.Materialize(first); err != nil {
		return nil, err
	}
	res := &trainResult{model: model, finalLoss: math.NaN()}
	for _, v := range model.Parameters() {
		res.parameters += v.Shape().Size()
	}
	acc.Printf("ResNet: width %d, %d block(s) per stage, dropout %g: %d parameters\n", cfg.width, cfg.blocks,
		cfg.dropout, res.parameters)
	if cfg.resume {
		switch err := acc.LoadState(cfg.checkpoints); {
		case errors.Is(err, accel.ErrNoCheckpoint):
			acc.Printf("no checkpoint in %s yet: starting from the beginning\n", cfg.checkpoints)
		case err != nil:
			return nil, err
		default:
			acc.Printf("resumed from %s at epoch %d, %d optimizer steps done\n", cfg.checkpoints, loader.Epoch()+1, opt.Steps())
		}
	}

	// The clock starts together on every process.
	if err := acc.WaitForEveryone(); err != nil {
		return nil, err
	}
	stopProfile, err := cpuprofile.Start(cfg.cpuProfile, acc.Rank(), acc.WorldSize())
	if err != nil {
		return nil, err
	}
	start := time.Now()
	var lossSum float64 // this process's, over the last epoch trained
	var batches int
	for epoch := loader.Epoch(); epoch < cfg.epochs; epoch++ {
		loader.SetEpoch(epoch) // every process shuffles alike, so the shards stay disjoint
		epochStart := time.Now()
		lossSum, batches = 0, 0
		for batch, err := range loader.All() {
			if err != nil {
				return nil, err
			}
			var loss float64
			err = acc.Accumulate(func() error {
				var err error
				if loss, err = acc.Backward(model, batch); err != nil {
					return err
				}
				if _, err := opt.Step(); err != nil {
					return err
				}
				return opt.ZeroGrad()
			})
			if nonFinite := new(accel.NonFiniteError); errors.As(err, &nonFinite) {
				return nil, fmt.Errorf("training diverged at optimizer step %d: %w; try a smaller -lr", nonFinite.Step, err)
			}
			if err != nil {
				return nil, fmt.Errorf("epoch %d, batch %d: %w", epoch+1, batch.Step+1, err)
			}
			lossSum += loss
			batches++
		}
		res.epochs++
		if !cfg.quiet {
			acc.Printf("epoch %d/%d: mean train loss %.4f%s, %d optimizer steps so far, %s\n", epoch+1, cfg.epochs,
				lossSum/float64(max(batches, 1)), rankNote(acc), opt.Steps(), time.Since(epochStart).Round(time.Millisecond))
		}
		if cfg.checkpoints != "" {
			// Saved after the epoch's last batch, the checkpoint resumes at the next epoch's start.
			if _, err := acc.SaveState(cfg.checkpoints); err != nil {
				return nil, err
			}
		}
	}
	res.trainTime = time.Since(start)
	if err := stopProfile(); err != nil {
		return nil, err
	}
	res.stats, res.microBatchCompute = acc.Stats(), model.ComputeTime()
	// The job's mean loss: one small all-reduce after training, so that it stays out of the counters.
	total, err := acc.Reduce(tensors.FromValue([]float64{lossSum, float64(batches)}), accel.Sum)
	if err != nil {
		return nil, fmt.Errorf("averaging the final loss: %w", err)
	}
	if sums := tensors.MustCopyFlatData[float64](total); sums[1] > 0 {
		res.finalLoss = sums[0] / sums[1]
	}
	return res, nil
}

// rankNote qualifies per-process numbers printed by the main process when there are several processes.
func rankNote(acc *accel.Accelerator) string {
	if acc.WorldSize() == 1 {
		return ""
	}
	return fmt.Sprintf(" (rank %d's shard)", acc.Rank())
}

// evalBatchSize is the per-process batch for evaluation: a forward pass keeps no gradients, so it can be
// larger than the training batch.
const evalBatchSize = 500

// evaluate returns the accuracy over the whole test set, every example counted once whatever the number of
// processes: each scores its shard, and the metrics gather the results. The model predicts with training
// off, so batch normalization uses its running averages and dropout keeps everything.
func evaluate(acc *accel.Accelerator, model *accel.Model, test *fashionmnist.Dataset) (float64, error) {
	src, err := accel.TensorSource([]*tensors.Tensor{test.Images}, []*tensors.Tensor{test.Labels},
		accel.SparseLabels(fashionmnist.NumClasses))
	if err != nil {
		return 0, err
	}
	// Prepared after training, and kept out of checkpoints.
	loader, err := acc.PrepareDataLoader(src, accel.BatchSize(evalBatchSize), accel.SkipCheckpoint())
	if err != nil {
		return 0, err
	}
	scores := accel.NewMetrics(acc, accel.Accuracy())
	for batch, err := range loader.All() {
		if err != nil {
			return 0, err
		}
		logits, err := model.Predict(batch.Inputs...)
		if err != nil {
			return 0, err
		}
		if err := scores.Update(logits[0], batch); err != nil {
			return 0, err
		}
	}
	if scores.Count() != int64(test.Len()) {
		return 0, fmt.Errorf("evaluation counted %d examples, the test set has %d", scores.Count(), test.Len())
	}
	return scores.Results()["accuracy"], nil
}
