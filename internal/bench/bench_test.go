package bench

import (
	"fmt"
	"sync"
	"testing"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
)

// The testing.B benchmarks cover what needs no MPI: the Reducer over goaccel's in-process engine (N
// goroutine ranks sharing memory) and the single-process training loops of section 4. Run them with
//
//	go test ./bench -run '^$' -bench . -count 10 | tee new.txt && benchstat new.txt
//
// and profile the loop with -cpuprofile (see docs/benchmarks-method.md).

// BenchmarkReducerInProcess syncs the bucketing model's gradients across in-process ranks for several
// bucket caps. It measures goaccel's own work per sync (planning is done once; buffers are reused) with
// memory bandwidth, not a network, as the limit.
func BenchmarkReducerInProcess(b *testing.B) {
	model := deepMLP()
	for _, ranks := range []int{2, 4} {
		for _, capBytes := range []int64{1 << 20, defaultBucketCapBytes} {
			b.Run(fmt.Sprintf("ranks=%d/cap=%s", ranks, formatBytes(capBytes)), func(b *testing.B) {
				benchmarkReducer(b, model, ranks, capBytes)
			})
		}
	}
}

func benchmarkReducer(b *testing.B, m mlp, ranks int, capBytes int64) {
	comms, err := backends.NewInProcessGroup(ranks)
	if err != nil {
		b.Fatal(err)
	}
	sets := make([]*bucketSet, ranks)
	reducers := make([]*accumulate.Reducer, ranks)
	for r := range ranks {
		if sets[r], err = newBucketSet(m.params(), 0, capBytes); err != nil {
			b.Fatal(err)
		}
		reducers[r] = accumulate.NewReducer(comms[r], sets[r].plan)
	}
	b.SetBytes(m.bytes())
	b.ResetTimer()
	// Each rank is a goroutine, as in-process ranks must be; b.N syncs on every rank.
	var wg sync.WaitGroup
	errs := make([]error, ranks)
	for r := range ranks {
		wg.Go(func() {
			for range b.N {
				if err := reducers[r].Sync(sets[r].tensors); err != nil {
					errs[r] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTrainStep is section 4 as a testing.B benchmark: one optimizer step (K micro-batches) of goaccel's loop
// and of GoMLX's Trainer, for each overhead model of the full plan. The benchmark names match the
// driver's, so benchstat can compare the two.
func BenchmarkTrainStep(b *testing.B) {
	for _, cfg := range fullPlan().Overhead {
		b.Run("model="+cfg.Name+"/impl=goaccel", func(b *testing.B) {
			t, err := newTrainer(cfg, 1, withSingle())
			if err != nil {
				b.Fatal(err)
			}
			defer t.close()
			benchmarkSteps(b, t.steps)
		})
		b.Run("model="+cfg.Name+"/impl=gomlx", func(b *testing.B) {
			g, err := newGoMLXTrainer(cfg, 1)
			if err != nil {
				b.Fatal(err)
			}
			benchmarkSteps(b, g.steps)
		})
	}
}

func benchmarkSteps(b *testing.B, steps func(int) error) {
	if err := steps(2); err != nil { // compiles the graphs
		b.Fatal(err)
	}
	b.ResetTimer()
	if err := steps(b.N); err != nil {
		b.Fatal(err)
	}
}
