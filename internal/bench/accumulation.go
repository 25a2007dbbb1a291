package bench

import (
	"fmt"
	"io"

	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/prepare"
)

// trainConfig is a training workload: a model, a per-rank micro-batch size and K micro-batches per
// optimizer step.
type trainConfig struct {
	Name  string // in benchmark names: "mlp", "bow"
	Model mlp
	Batch int
	K     int
}

// accumulationResult compares, for one world size and workload, gradient accumulation (one sync every K
// micro-batches) with syncing every micro-batch. Every sample is the time of K micro-batches: one
// optimizer step of the accumulating loop. Each series' Extra holds the all-reduce calls and bytes per
// step, read from the Communicator's counters.
type accumulationResult struct {
	Ranks  int
	Config trainConfig
	// Accumulate syncs once per K micro-batches. SyncEveryMicroBatch is the same loop plus an all-reduce of
	// the model's bucket layout after each micro-batch that does not sync, as DDP without no_sync.
	// SyncEachBatch is goaccel's WithSyncEachBatch: an all-reduce per micro-batch, an optimizer step per K.
	Accumulate, SyncEveryMicroBatch, SyncEachBatch series
}

const (
	callsUnit = "allreduce-calls/op"
	bytesUnit = "allreduce-B/op"
)

// trainer is one prepared goaccel training loop over a few synthetic batches.
type trainer struct {
	acc     *accel.Accelerator
	model   *prepare.Model
	opt     *prepare.Optimizer
	batches []prepare.Batch
	next    int
	// extraSync, when set, runs after every micro-batch that did not sync.
	extraSync func() error
}

func newTrainer(cfg trainConfig, seed uint64, opts ...accel.Option) (*trainer, error) {
	opts = append([]accel.Option{accel.WithBackend("go"), accel.WithGradientAccumulationSteps(cfg.K),
		accel.WithOutput(io.Discard)}, opts...)
	acc, err := accel.New(opts...)
	if err != nil {
		return nil, err
	}
	model, err := acc.PrepareModel(context.New(), cfg.Model.modelFn, loss)
	if err != nil {
		return nil, err
	}
	opt, err := acc.PrepareOptimizer(model, newSGD())
	if err != nil {
		return nil, err
	}
	// A few distinct batches, reused: the data pipeline is not what is measured.
	batches := cfg.Model.batches(2*cfg.K, cfg.Batch, seed)
	if err := model.Materialize(batches[0]); err != nil {
		return nil, err
	}
	return &trainer{acc: acc, model: model, opt: opt, batches: batches}, nil
}

// newSGD is the optimizer of every training measurement: plain SGD, whose update is cheap, so the
// measurements are about the loop rather than the optimizer.
func newSGD() optimizers.Interface {
	return optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(0.01)
}

// microBatch is the user's loop body, as in the package examples.
func (t *trainer) microBatch() error {
	batch := t.batches[t.next%len(t.batches)]
	t.next++
	return t.acc.Accumulate(func() error {
		if _, err := t.acc.Backward(t.model, batch); err != nil {
			return err
		}
		if t.extraSync != nil && !t.acc.SyncGradients() {
			if err := t.extraSync(); err != nil {
				return err
			}
		}
		if _, err := t.opt.Step(); err != nil {
			return err
		}
		return t.opt.ZeroGrad()
	})
}

// steps runs n optimizer steps' worth of micro-batches (n·K).
func (t *trainer) steps(n int) error {
	for range n * t.acc.GradientAccumulationSteps() {
		if err := t.microBatch(); err != nil {
			return err
		}
	}
	return nil
}

// close releases the Accelerator: over a borrowed communicator nothing can fail to close.
func (t *trainer) close() { _ = t.acc.Close() }

// measureAccumulation compares accumulating K micro-batches per sync with syncing every micro-batch, on
// real GoMLX training steps over comm. Collective.
func measureAccumulation(comm *backends.Communicator, barrier func() error, cfg trainConfig, t timing) (accumulationResult, error) {
	res := accumulationResult{Ranks: comm.Size(), Config: cfg}
	seed := uint64(comm.Rank() + 1)
	names := []string{"accumulate", "sync-every-micro-batch", "sync-each-batch"}
	loops := make([]*trainer, len(names))
	for i, name := range names {
		opts := []accel.Option{accel.WithCommunicator(comm)}
		if name == "sync-each-batch" {
			opts = append(opts, accel.WithSyncEachBatch())
		}
		tr, err := newTrainer(cfg, seed, opts...)
		if err != nil {
			return res, err
		}
		defer tr.close()
		loops[i] = tr
	}
	// The extra syncs all-reduce buffers shaped like the model's buckets, through the model's own plan:
	// the communication of a sync without touching the real accumulators, whose sum must stay this rank's.
	scratch, err := bucketsFor(loops[1].model.Plan())
	if err != nil {
		return res, err
	}
	scratchReducer := accumulate.NewReducer(comm, scratch.plan)
	loops[1].extraSync = func() error { return scratchReducer.Sync(scratch.tensors) }

	counts := make([][2]float64, len(loops)) // per variant: all-reduce calls and bytes per step
	var variants []variant
	for i, name := range names {
		variants = append(variants, variant{
			fmt.Sprintf("Accumulation/model=%s/%s/k=%d/ranks=%d", cfg.Name, name, cfg.K, comm.Size()),
			func(iters int) error {
				before := comm.Stats().Of(backends.OpAllReduce)
				if err := loops[i].steps(iters); err != nil {
					return err
				}
				after := comm.Stats().Of(backends.OpAllReduce)
				counts[i] = [2]float64{float64(after.Calls-before.Calls) / float64(iters),
					float64(after.Bytes-before.Bytes) / float64(iters)}
				return nil
			}})
	}
	s, err := group{comm: comm, barrier: barrier, timing: t}.measure(variants...)
	if err != nil {
		return res, fmt.Errorf("accumulation: %w", err)
	}
	for i := range s {
		s[i].Extra = map[string]float64{callsUnit: counts[i][0], bytesUnit: counts[i][1]}
	}
	res.Accumulate, res.SyncEveryMicroBatch, res.SyncEachBatch = s[0], s[1], s[2]
	return res, nil
}
