package accel_test

import (
	"fmt"
	"math"
	"os"
	"strconv"

	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/accel"
)

// bestLoss is the loop's own state: the lowest loss seen so far, as text.
type bestLoss struct{ value float64 }

func (b *bestLoss) MarshalBinary() ([]byte, error) {
	return strconv.AppendFloat(nil, b.value, 'g', -1, 64), nil
}

func (b *bestLoss) UnmarshalBinary(data []byte) error {
	v, err := strconv.ParseFloat(string(data), 64)
	b.value = v
	return err
}

// batchesSeen counts the batches this process trained on: each process has its own count.
type batchesSeen struct{ n int }

func (c *batchesSeen) MarshalBinary() ([]byte, error) { return []byte(strconv.Itoa(c.n)), nil }

func (c *batchesSeen) UnmarshalBinary(data []byte) error {
	n, err := strconv.Atoi(string(data))
	c.n = n
	return err
}

// RegisterForCheckpointing puts the loop's own state in the checkpoints: a run resumed from one continues
// with the best loss and the per-process count where the saved run left them.
func ExampleAccelerator_RegisterForCheckpointing() {
	dir, _ := os.MkdirTemp("", "goaccel-example")
	defer os.RemoveAll(dir)
	var savedBest float64
	run := func(resume bool, batches int) {
		acc, _ := accel.New(accel.WithSeed(1), accel.WithBackend("go"))
		defer acc.Close()
		best, seen := &bestLoss{value: math.Inf(1)}, &batchesSeen{}
		_ = acc.RegisterForCheckpointing("best-loss", best) // the same on every process: saved once
		_ = acc.RegisterForCheckpointing("batches-seen", seen, accel.PerRank())
		model, _ := acc.PrepareModel(context.New(), linear, losses.MeanSquaredError)
		opt, _ := acc.PrepareOptimizer(model, optimizers.Adam().Done())
		loader, _ := acc.PrepareDataLoader(lineData(32), accel.BatchSize(4))
		if resume {
			err := acc.LoadState(dir)
			fmt.Printf("resumed: the saved best loss: %t, after %d batches (%v)\n", best.value == savedBest, seen.n, err)
		}
		for batch := range loader.All() {
			loss, _ := acc.Backward(model, batch)
			_, _ = opt.Step()
			best.value, seen.n = min(best.value, loss), seen.n+1
			if seen.n == batches {
				break
			}
		}
		if _, err := acc.SaveState(dir); err != nil {
			fmt.Println(err)
		}
		savedBest = best.value
		fmt.Printf("saved after %d batches\n", seen.n)
	}
	run(false, 3)
	run(true, -1)

	// A run that does not register a value the checkpoint holds is refused, naming it.
	acc, _ := accel.New(accel.WithSeed(1), accel.WithBackend("go"))
	defer acc.Close()
	model, _ := acc.PrepareModel(context.New(), linear, losses.MeanSquaredError)
	_, _ = acc.PrepareOptimizer(model, optimizers.Adam().Done())
	_, _ = acc.PrepareDataLoader(lineData(32), accel.BatchSize(4))
	_ = acc.RegisterForCheckpointing("best-loss", &bestLoss{})
	latest, _ := accel.LatestCheckpoint(dir)
	err := acc.LoadState(latest)
	fmt.Println(err != nil)
	// Output:
	// saved after 3 batches
	// resumed: the saved best loss: true, after 3 batches (<nil>)
	// saved after 8 batches
	// true
}
