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

// TrainConfig is a training workload: a model, a per-rank micro-batch size and K micro-batches per
// optimizer step.
type TrainConfig struct {
	// Name identifies the workload in benchmark names ("mlp", "bow").
	Name  string `json:"name"`
	Model MLP    `json:"model"`
	Batch int    `json:"batch"`
	K     int    `json:"k"`
}

// AccumulationResult compares, for one world size, gradient accumulation (one sync every K micro-batches)
// with syncing every micro-batch. Every sample is the time of K micro-batches: one optimizer step of the
// accumulating run.
type AccumulationResult struct {
	Ranks  int         `json:"ranks"`
	Config TrainConfig `json:"config"`
	// Accumulate syncs once per K micro-batches (accel.Accumulate with WithGradientAccumulationSteps(K)).
	Accumulate Series `json:"accumulate"`
	// SyncEveryMicroBatch is the same loop with the gradients all-reduced after every micro-batch and the
	// optimizer still stepping once per K, what DDP does without no_sync: the K−1 extra all-reduces are
	// issued on buffers shaped like the model's buckets, through the model's own bucket plan.
	SyncEveryMicroBatch Series `json:"sync_every_micro_batch"`
	// SyncEachBatch is goaccel's WithSyncEachBatch: every micro-batch syncs, and (by goaccel's rule that
	// the optimizer steps on every sync) steps the optimizer too, so it also pays K−1 extra updates.
	SyncEachBatch Series `json:"sync_each_batch"`
	// Per optimizer step of the accumulating run (K micro-batches), by variant name: collective calls
	// and bytes of all-reduce.
	Calls map[string]float64 `json:"calls"`
	Bytes map[string]float64 `json:"bytes"`
}

// trainer is one prepared training loop.
type trainer struct {
	acc     *accel.Accelerator
	model   *prepare.Model
	opt     *prepare.Optimizer
	batches []prepare.Batch
	next    int
	// extraSync, when set, runs after every micro-batch that did not sync.
	extraSync func() error
}

func newTrainer(cfg TrainConfig, seed uint64, opts ...accel.Option) (*trainer, error) {
	opts = append([]accel.Option{accel.WithBackend("go"), accel.WithGradientAccumulationSteps(cfg.K),
		accel.WithOutput(io.Discard)}, opts...)
	acc, err := accel.New(opts...)
	if err != nil {
		return nil, err
	}
	model, err := acc.PrepareModel(context.New(), cfg.Model.Model, Loss)
	if err != nil {
		return nil, err
	}
	opt, err := acc.PrepareOptimizer(model, newSGD())
	if err != nil {
		return nil, err
	}
	// A few distinct batches, reused: the data pipeline is not what is measured, and every rank gets its own.
	batches := cfg.Model.Batches(2*cfg.K, cfg.Batch, seed)
	if err := model.Materialize(batches[0]); err != nil {
		return nil, err
	}
	return &trainer{acc: acc, model: model, opt: opt, batches: batches}, nil
}

// newSGD is the optimizer every training measurement uses: plain SGD, whose update is cheap, so the
// measurements are about the loop rather than the optimizer.
func newSGD() optimizers.Interface {
	return optimizers.StochasticGradientDescent().WithDecay(false).WithLearningRate(0.01)
}

// microBatch is the user's loop body, as in DESIGN §3.
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
		err := t.opt.ZeroGrad()
		return err
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

// close releases the Accelerator. Over a borrowed communicator (WithCommunicator, as every trainer here
// uses) there is nothing that can fail to close.
func (t *trainer) close() { _ = t.acc.Close() }

// MeasureAccumulation compares accumulating K micro-batches per sync with syncing every micro-batch, on
// real GoMLX training steps over comm (every variant shares it, so counters are read as differences).
// Collective.
func MeasureAccumulation(comm *backends.Communicator, barrier func() error, cfg TrainConfig, t Timing) (AccumulationResult, error) {
	res := AccumulationResult{Ranks: comm.Size(), Config: cfg, Calls: map[string]float64{}, Bytes: map[string]float64{}}
	seed := uint64(comm.Rank() + 1)
	accumulating, err := newTrainer(cfg, seed, accel.WithCommunicator(comm))
	if err != nil {
		return res, err
	}
	defer accumulating.close()
	everyMicro, err := newTrainer(cfg, seed, accel.WithCommunicator(comm))
	if err != nil {
		return res, err
	}
	defer everyMicro.close()
	// Buffers shaped like the model's buckets, all-reduced by a Reducer over the model's own plan: the
	// communication of a sync without touching the real accumulators, whose sum must stay this rank's.
	scratch, err := bucketsFor(everyMicro.model.Plan())
	if err != nil {
		return res, err
	}
	scratchReducer := accumulate.NewReducer(comm, scratch.plan)
	everyMicro.extraSync = func() error { return scratchReducer.Sync(scratch.tensors) }
	eachBatch, err := newTrainer(cfg, seed, accel.WithCommunicator(comm), accel.WithSyncEachBatch())
	if err != nil {
		return res, err
	}
	defer eachBatch.close()

	name := func(variant string) string {
		return fmt.Sprintf("Accumulation/%s/k=%d/ranks=%d", variant, cfg.K, comm.Size())
	}
	variants := []struct {
		name string
		t    *trainer
	}{
		{name("accumulate"), accumulating},
		{name("sync-every-micro-batch"), everyMicro},
		{name("sync-each-batch"), eachBatch},
	}
	counted := map[string]*[2]float64{} // name → calls, bytes
	var measured []Variant
	for _, v := range variants {
		c := &[2]float64{}
		counted[v.name] = c
		measured = append(measured, Variant{Name: v.name, Run: func(iters int) error {
			before := comm.Stats().Of(backends.OpAllReduce)
			if err := v.t.steps(iters); err != nil {
				return err
			}
			after := comm.Stats().Of(backends.OpAllReduce)
			c[0] = float64(after.Calls-before.Calls) / float64(iters)
			c[1] = float64(after.Bytes-before.Bytes) / float64(iters)
			return nil
		}})
	}
	series, err := Group{Comm: comm, Barrier: barrier, Timing: t}.Measure(measured...)
	if err != nil {
		return res, fmt.Errorf("accumulation: %w", err)
	}
	for i := range series {
		c := counted[series[i].Name]
		res.Calls[series[i].Name], res.Bytes[series[i].Name] = c[0], c[1]
		series[i].Extra = map[string]float64{"allreduce-calls/op": c[0], "allreduce-B/op": c[1]}
	}
	res.Accumulate, res.SyncEveryMicroBatch, res.SyncEachBatch = series[0], series[1], series[2]
	return res, nil
}
