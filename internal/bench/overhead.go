package bench

import (
	"fmt"

	gomlxbackends "github.com/gomlx/gomlx/backends"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
)

// overheadResult compares goaccel's training loop with GoMLX's own train.Trainer in one process: same
// model, batches, optimizer and compute backend, K micro-batches per optimizer step on both sides. Each
// sample is the time of one optimizer step.
type overheadResult struct {
	Config         trainConfig
	Goaccel, GoMLX series
}

// gomlxTrainer is the reference: train.Trainer, with AccumulateGradients(K) when K > 1, fed the same
// batches.
type gomlxTrainer struct {
	trainer *train.Trainer
	batches [][2][]*tensors.Tensor
	k, next int
}

func newGoMLXTrainer(cfg trainConfig, seed uint64) (*gomlxTrainer, error) {
	backend, err := benchBackend(false)
	if err != nil {
		return nil, err
	}
	return newGoMLXTrainerOn(backend, cfg, seed)
}

// benchBackend is the pure-Go backend with goaccel's kernels chosen by environment variables, resolved as an
// Accelerator would (the compute section's children choose them so); or, asShipped, GoMLX's pure-Go backend
// as GoMLX ships it: built by GoMLX itself, so none of goaccel's gradient rules, executors or builder
// wrappers is installed in the process.
func benchBackend(asShipped bool) (gomlxbackends.Backend, error) {
	if asShipped {
		// Operations one at a time: GoMLX's parallel scheduler and its own matrix products can wait for each
		// other forever (see cpu.SequentialPureGo).
		return gomlxbackends.NewWithConfig(cpu.SequentialPureGo)
	}
	conf, err := accel.Resolve(accel.WithBackend(cpu.PureGo))
	if err != nil {
		return nil, err
	}
	return cpu.New(conf.Compute)
}

func newGoMLXTrainerOn(backend gomlxbackends.Backend, cfg trainConfig, seed uint64) (*gomlxTrainer, error) {
	ctx := context.New()
	if err := ctx.SetRNGStateFromSeed(int64(seed)); err != nil {
		return nil, err
	}
	tr := train.NewTrainer(backend, ctx,
		func(ctx *context.Context, _ any, inputs []*Node) []*Node { return cfg.Model.modelFn(ctx, inputs) },
		loss, newSGD(), nil, nil)
	if cfg.K > 1 {
		if err := tr.AccumulateGradients(cfg.K); err != nil {
			return nil, err
		}
	}
	g := &gomlxTrainer{trainer: tr, k: max(cfg.K, 1)}
	for _, b := range cfg.Model.batches(2*g.k, cfg.Batch, seed) {
		g.batches = append(g.batches, [2][]*tensors.Tensor{b.Inputs, b.Labels})
	}
	return g, nil
}

// steps runs n optimizer steps (n·K TrainStep calls).
func (g *gomlxTrainer) steps(n int) (err error) {
	defer func() {
		// GoMLX reports graph-building errors by panicking.
		if r := recover(); r != nil {
			err = fmt.Errorf("gomlx trainer: %v", r)
		}
	}()
	for range n * g.k {
		b := g.batches[g.next%len(g.batches)]
		g.next++
		if _, err := g.trainer.TrainStep(nil, b[0], b[1]); err != nil {
			return err
		}
	}
	return nil
}

// withSingle runs an Accelerator at world size 1 whatever the environment says (the driver itself may
// have been started by a launcher).
func withSingle() accel.Option { return accel.WithCommunicator(backends.NewSingle()) }

// measureOverhead times goaccel's loop at world size 1 against GoMLX's Trainer, interleaved.
func measureOverhead(cfg trainConfig, t timing) (overheadResult, error) {
	res := overheadResult{Config: cfg}
	ours, err := newTrainer(cfg, 1, withSingle())
	if err != nil {
		return res, err
	}
	defer ours.close()
	theirs, err := newGoMLXTrainer(cfg, 1)
	if err != nil {
		return res, err
	}
	name := func(impl string) string { return fmt.Sprintf("TrainStep/model=%s/impl=%s/k=%d", cfg.Name, impl, cfg.K) }
	s, err := group{timing: t}.measure(variant{name("goaccel"), ours.steps}, variant{name("gomlx"), theirs.steps})
	if err != nil {
		return res, fmt.Errorf("overhead: %w", err)
	}
	res.Goaccel, res.GoMLX = s[0], s[1]
	return res, nil
}
