// Command classifier is a complete training program of the kind a user ports to goaccel: its own model (an
// MLP on three Gaussian clusters), Adam with a warm-up + cosine schedule sized by the job, evaluation with
// package metrics on a held-out split, a checkpoint after every epoch and resuming from the newest.
//
//	go run ./examples/classifier -checkpoints /tmp/classifier
//	go run ./examples/classifier -checkpoints /tmp/classifier -resume -epochs 8   # continues
//	go build -tags mpi -o bin/classifier ./examples/classifier && bin/accel launch -n 2 -- bin/classifier
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accel"
)

const classes = 3

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "classifier:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("classifier", flag.ContinueOnError)
	epochs := fs.Int("epochs", 5, "passes over the training data")
	checkpoints := fs.String("checkpoints", "", "save a checkpoint here after every epoch (empty: none)")
	resume := fs.Bool("resume", false, "continue from the newest checkpoint under -checkpoints")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *resume && *checkpoints == "" {
		return errors.New("-resume needs -checkpoints")
	}

	opts := []accel.Option{accel.WithGradientAccumulationSteps(2), accel.WithSeed(7), accel.WithOutput(out)}
	if *checkpoints != "" {
		opts = append(opts, accel.WithCheckpointDir(*checkpoints)) // checked and held from the start
	}
	acc, err := accel.New(opts...)
	if err != nil {
		return err
	}
	defer func() { _ = acc.CloseWithError(err) }()

	train, test := clusters(1024, 1), clusters(256, 2)
	p, err := acc.Prepare(accel.Spec{
		Model: mlp, Loss: losses.SparseCategoricalCrossEntropyLogits,
		Optimizer:     optimizers.Adam().Done(),
		SizedSchedule: accel.Cosine(0.01, 10), Epochs: *epochs, // sized by the job: Epochs × the training set
		Loaders: []accel.LoaderSpec{{Source: train, Options: []accel.LoaderOption{accel.BatchSize(32), accel.Shuffle()}}},
	})
	if err != nil {
		return err
	}
	loader := p.Loaders[0]
	if *resume {
		if err := acc.LoadState(*checkpoints); err != nil {
			return err
		}
		acc.Printf("resumed at epoch %d\n", loader.Epoch())
	}

	for epoch := loader.Epoch(); epoch < *epochs; epoch++ {
		loader.SetEpoch(epoch)
		// The epoch's training loss on this process: each batch's mean loss weighted by its examples, so that
		// the epoch's loss is a mean over examples however the batches are sized (the last one may be short).
		var lossSum, examples float64
		for batch, err := range loader.All() {
			if err != nil {
				return err
			}
			err = acc.Accumulate(func() error {
				loss, err := acc.Backward(p.Model, batch)
				if err != nil {
					return err
				}
				lossSum, examples = lossSum+loss*float64(batch.Size()), examples+float64(batch.Size())
				if _, err := p.Optimizer.Step(); err != nil {
					return err
				}
				return p.Optimizer.ZeroGrad()
			})
			if err != nil {
				return err
			}
		}
		// Over every process: each one's mean weighted by its examples (a plain mean of the processes' losses
		// would not weigh them by what they trained).
		trainLoss, _, err := acc.WeightedMean(lossSum/examples, examples)
		if err != nil {
			return err
		}
		results, err := evaluate(acc, p.Model, test)
		if err != nil {
			return err
		}
		acc.Printf("epoch %d: accuracy %.3f, cross-entropy %.3f, train loss %.3f\n", epoch+1, results["accuracy"],
			results["cross_entropy"], trainLoss)
		if *checkpoints != "" {
			// Saved after the epoch's last batch, the checkpoint resumes at the next epoch's start.
			if _, err := acc.SaveState(*checkpoints); err != nil {
				return err
			}
		}
	}
	return nil
}

// mlp is the model: one hidden layer of 32 ReLU units.
func mlp(ctx *context.Context, in []*graph.Node) []*graph.Node {
	h := activations.Relu(layers.Dense(ctx.In("hidden"), in[0], true, 32))
	return []*graph.Node{layers.Dense(ctx.In("output"), h, true, classes)}
}

// evaluate scores the test split, every example once whatever the number of processes.
func evaluate(acc *accel.Accelerator, model *accel.Model, test accel.Source) (map[string]float64, error) {
	loader, err := acc.PrepareDataLoader(test, accel.BatchSize(64), accel.SkipCheckpoint())
	if err != nil {
		return nil, err
	}
	scores := accel.NewMetrics(acc, accel.Accuracy(), accel.CrossEntropy())
	for batch, err := range loader.All() {
		if err != nil {
			return nil, err
		}
		logits, err := model.Predict(batch.Inputs...)
		if err != nil {
			return nil, err
		}
		if err := scores.Update(logits[0], batch); err != nil {
			return nil, err
		}
	}
	return scores.Results(), nil
}

// clusters draws n points around three centres, labelled by their centre (class labels checked up front).
func clusters(n int, seed uint64) accel.Source {
	rng := rand.New(rand.NewPCG(seed, 3))
	centres := [classes][2]float64{{-2, 0}, {2, 0}, {0, 2.5}}
	x, y := make([]float32, 2*n), make([]int32, n)
	for i := range n {
		c := rng.IntN(classes)
		x[2*i] = float32(centres[c][0] + rng.NormFloat64()*0.7)
		x[2*i+1] = float32(centres[c][1] + rng.NormFloat64()*0.7)
		y[i] = int32(c)
	}
	src, err := accel.TensorSource([]*tensors.Tensor{tensors.FromFlatDataAndDimensions(x, n, 2)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(y, n, 1)}, accel.SparseLabels(classes))
	if err != nil {
		panic(err) // the shapes and labels above are always valid
	}
	return src
}
