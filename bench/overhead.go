package bench

import (
	"fmt"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/backends/compute"
)

// OverheadResult compares goaccel's training loop with GoMLX's own train.Trainer in one process: same
// model, data, optimizer and compute backend, K micro-batches per optimizer step on both sides. Each
// sample is the time of one optimizer step (K micro-batches), graph compilation excluded by the warm-up.
type OverheadResult struct {
	Config  TrainConfig `json:"config"`
	Goaccel Series      `json:"goaccel"`
	GoMLX   Series      `json:"gomlx"`
}

// gomlxTrainer is the reference: train.Trainer with AccumulateGradients(K), fed the same batches.
type gomlxTrainer struct {
	trainer *train.Trainer
	batches [][2][]*tensors.Tensor
	k, next int
}

func newGoMLXTrainer(cfg TrainConfig, seed uint64) (*gomlxTrainer, error) {
	backend, err := compute.New(compute.Config{Backend: "go"})
	if err != nil {
		return nil, err
	}
	ctx := context.New()
	if err := ctx.SetRNGStateFromSeed(int64(seed)); err != nil {
		return nil, err
	}
	tr := train.NewTrainer(backend, ctx,
		func(ctx *context.Context, _ any, inputs []*Node) []*Node { return cfg.Model.Model(ctx, inputs) },
		Loss, newSGD(), nil, nil)
	if err := tr.AccumulateGradients(cfg.K); err != nil {
		return nil, err
	}
	g := &gomlxTrainer{trainer: tr, k: cfg.K}
	for _, b := range cfg.Model.Batches(2*cfg.K, cfg.Batch, seed) {
		g.batches = append(g.batches, [2][]*tensors.Tensor{b.Inputs, b.Labels})
	}
	return g, nil
}

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

// MeasureOverhead times goaccel's loop (Accumulate, Backward, Step, ZeroGrad at world size 1) against
// GoMLX's Trainer.TrainStep with AccumulateGradients(K), interleaved, in this process.
func MeasureOverhead(cfg TrainConfig, t Timing) (OverheadResult, error) {
	res := OverheadResult{Config: cfg}
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
	series, err := Group{Timing: t}.Measure(
		Variant{Name: name("goaccel"), Run: ours.steps},
		Variant{Name: name("gomlx"), Run: theirs.steps},
	)
	if err != nil {
		return res, fmt.Errorf("overhead: %w", err)
	}
	res.Goaccel, res.GoMLX = series[0], series[1]
	return res, nil
}
