package accel_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// settingsRun is one rank's configuration in TestMPISettingsMismatch.
type settingsRun struct {
	k     int
	seed  uint64
	batch int
	lr    float64
	split bool
	// fewer examples in the rank's dataset than the others' (as many batches per rank all the same)
	fewer       int
	compression accumulate.Compression
}

// settingsCases give the last rank (or, for the seed, every rank) a setting of its own. want is what the
// error must say on every rank, given the world size.
var settingsCases = map[string]struct {
	run  func(rank, size int) settingsRun
	want func(size int) string
}{
	"accumulation steps": {
		func(rank, size int) settingsRun {
			return settingsRun{k: 2 + boolInt(rank == size-1), seed: 1, batch: 2, lr: 0.01}
		},
		func(size int) string {
			return "disagree on gradient accumulation steps (K): " + others(size) + " 2; " + fmt.Sprintf("rank %d has 3", size-1)
		},
	},
	"seed": {
		func(rank, _ int) settingsRun { return settingsRun{k: 2, seed: uint64(rank), batch: 2, lr: 0.01} },
		func(int) string { return "disagree on seed: rank 0 has 0; rank 1 has 1" },
	},
	"batch size": {
		func(rank, size int) settingsRun {
			return settingsRun{k: 2, seed: 1, batch: 2 - boolInt(rank == size-1), lr: 0.01}
		},
		func(size int) string {
			return "disagree on data loader 0's batch size per process: " + others(size) + " 2; " +
				fmt.Sprintf("rank %d has 1", size-1)
		},
	},
	"split batches": {
		func(rank, size int) settingsRun {
			return settingsRun{k: 2, seed: 1, batch: 4, lr: 0.01, split: rank == size-1}
		},
		func(size int) string {
			return "disagree on split batches: " + others(size) + " false; " + fmt.Sprintf("rank %d has true", size-1)
		},
	},
	"number of examples": {
		func(rank, size int) settingsRun {
			return settingsRun{k: 2, seed: 1, batch: 2, lr: 0.01, fewer: boolInt(rank == size-1)}
		},
		func(size int) string {
			return "disagree on data loader 0's number of examples: " + others(size) + fmt.Sprintf(" %d; ", 8*size) +
				fmt.Sprintf("rank %d has %d", size-1, 8*size-1)
		},
	},
	"gradient compression": {
		func(rank, size int) settingsRun {
			s := settingsRun{k: 2, seed: 1, batch: 2, lr: 0.01}
			if rank == size-1 {
				s.compression = accumulate.BF16
			}
			return s
		},
		func(size int) string {
			return "disagree on gradient communication hook (GOACCEL_GRADIENT_COMPRESSION or " +
				"accel.WithGradientCompression): " + others(size) + " identity; " +
				fmt.Sprintf("rank %d has bf16 compression", size-1)
		},
	},
	"learning rate": {
		func(rank, size int) settingsRun {
			return settingsRun{k: 2, seed: 1, batch: 2, lr: 0.01 * float64(1+boolInt(rank == size-1))}
		},
		func(size int) string { return "disagree on optimizer 0's configuration" },
	},
}

// others names the ranks but the last, as the error does.
func others(size int) string {
	if size == 2 {
		return "rank 0 has"
	}
	names := ""
	for r := range size - 1 {
		switch {
		case r == 0:
			names = "0"
		case r == size-2:
			names += " and " + fmt.Sprint(r)
		default:
			names += ", " + fmt.Sprint(r)
		}
	}
	return "ranks " + names + " have"
}

// TestMPISettingsMismatch: ranks started with different settings (K, seed, batch size, learning rate)
// fail on their first Backward, every rank with the same error naming the setting and which ranks have
// which value, instead of training diverged replicas, overlapping shards or hanging.
func TestMPISettingsMismatch(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(func(keeper *backends.Communicator) (any, error) {
			errs := map[string]string{}
			// Every rank must run the cases in the same order: their collectives match by order.
			for _, name := range slices.Sorted(maps.Keys(settingsCases)) {
				s := settingsCases[name].run(keeper.Rank(), keeper.Size())
				opts := []accel.Option{accel.WithBackend("go"), accel.WithGradientAccumulationSteps(s.k), accel.WithSeed(s.seed),
					accel.WithGradientCompression(s.compression)}
				if s.split {
					opts = append(opts, accel.WithSplitBatches())
				}
				acc, err := accel.New(opts...)
				if err != nil {
					return nil, err
				}
				model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
				if err != nil {
					return nil, err
				}
				opt, err := acc.PrepareOptimizer(model, optimizers.Adam().LearningRate(s.lr).Done())
				if err != nil {
					return nil, err
				}
				x, y := testmodel.Data(acc.WorldSize()*8-s.fewer, 1)
				src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
				if err != nil {
					return nil, err
				}
				loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(s.batch), prepare.Shuffle())
				if err != nil {
					return nil, err
				}
				_, trainErr := (resumable{model, opt, loader}).train(acc, 1, 0)
				if trainErr == nil {
					return nil, fmt.Errorf("%s: training with settings that differ across ranks succeeded", name)
				}
				errs[name] = trainErr.Error()
				if err := acc.Close(); err != nil {
					return nil, err
				}
			}
			return errs, nil
		}))
		return
	}
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			results := mpitest.Run(t, np, t.Name(), mpitest.WithTimeout(2*time.Minute))
			var first map[string]string
			for rank, res := range results {
				var errs map[string]string
				require.NoError(t, res.Decode(&errs))
				if rank == 0 {
					first = errs
				}
				for name, c := range settingsCases {
					assert.Contains(t, errs[name], c.want(np), "%s, rank %d", name, rank)
					assert.Equal(t, first[name], errs[name], "%s: every rank must say the same", name)
				}
			}
		})
	}
}
