package accel_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// unevenData gives each rank its own rows of one dataset: rank r has batches[r] batches of sizes[r]
// examples, cut in order, rank after rank.
type unevenData struct {
	batches, sizes []int
}

func (u unevenData) rows() int {
	n := 0
	for r := range u.batches {
		n += u.batches[r] * u.sizes[r]
	}
	return n
}

// rankBatches are rank r's batches.
func (u unevenData) rankBatches(inputs, labels *tensors.Tensor, r int) []prepare.Batch {
	start := 0
	for q := range r {
		start += u.batches[q] * u.sizes[q]
	}
	var out []prepare.Batch
	for i := range u.batches[r] {
		from, to := start+i*u.sizes[r], start+(i+1)*u.sizes[r]
		out = append(out, prepare.Batch{Inputs: []*tensors.Tensor{testmodel.Rows(inputs, from, to)},
			Labels: []*tensors.Tensor{testmodel.Rows(labels, from, to)}})
	}
	return out
}

// reference is what one process training on every rank's micro-batches of each step, concatenated, takes:
// optimizer step s uses micro-batches [s·K, (s+1)·K) of every rank that still has them.
func (u unevenData) reference(inputs, labels *tensors.Tensor, k int) [][2]*tensors.Tensor {
	var steps [][2]*tensors.Tensor
	for s := 0; ; s++ {
		var xs, ys []*tensors.Tensor
		for r := range u.batches {
			batches := u.rankBatches(inputs, labels, r)
			for m := s * k; m < min((s+1)*k, len(batches)); m++ {
				xs, ys = append(xs, batches[m].Inputs[0]), append(ys, batches[m].Labels[0])
			}
		}
		if len(xs) == 0 {
			return steps
		}
		steps = append(steps, [2]*tensors.Tensor{concatRows(xs), concatRows(ys)})
	}
}

// concatRows stacks tensors along their first axis.
func concatRows(ts []*tensors.Tensor) *tensors.Tensor {
	var data []byte
	rows := 0
	for _, t := range ts {
		rows += t.Shape().Dimensions[0]
		if err := t.ConstBytes(func(b []byte) { data = append(data, b...) }); err != nil {
			panic(err)
		}
	}
	dims := append([]int{rows}, ts[0].Shape().Dimensions[1:]...)
	out := tensors.FromShape(shapes.Make(ts[0].DType(), dims...))
	if err := out.MutableBytes(func(b []byte) { copy(b, data) }); err != nil {
		panic(err)
	}
	return out
}

// TestJoinUnevenInputs: processes with very different numbers of batches (of different sizes, and one with
// none) train inside Join without a deadlock; every process ends with the same weights, those of one process
// taking each optimizer step on the union of the examples the processes had for it (the mean over real
// examples), with SGD and Adam, K = 1 and 2, on 2 and 4 processes.
func TestJoinUnevenInputs(t *testing.T) {
	for _, tc := range []struct {
		name string
		data unevenData
		k    int
		kind testmodel.OptimizerKind
	}{
		{"2 processes, 7 and 2 batches", unevenData{batches: []int{7, 2}, sizes: []int{2, 3}}, 1, testmodel.SGD},
		{"2 processes, K=2", unevenData{batches: []int{6, 2}, sizes: []int{2, 2}}, 2, testmodel.Adam},
		{"4 processes, one without data", unevenData{batches: []int{5, 1, 3, 0}, sizes: []int{2, 4, 1, 2}}, 1, testmodel.Adam},
		{"4 processes, K=2", unevenData{batches: []int{8, 2, 4, 6}, sizes: []int{1, 3, 2, 2}}, 2, testmodel.SGD},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ranks := len(tc.data.batches)
			inputs, labels := testmodel.Data(tc.data.rows(), 9)
			shape, _ := testmodel.Data(2, 1)
			var initial *context.Context
			finals := make([][32]byte, ranks)
			params := make([]*prepare.Model, ranks)
			runRanks(t, ranks, []accel.Option{accel.WithGradientAccumulationSteps(tc.k)}, func(rank int, acc *accel.Accelerator) error {
				model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
				if err != nil {
					return err
				}
				opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(tc.kind))
				if err != nil {
					return err
				}
				// Every process builds the model from a batch of the same shape (one has no batch of its own).
				x, y := shape, testmodel.Rows(labels, 0, 2)
				if err := model.Materialize(prepare.Batch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{y}}); err != nil {
					return err
				}
				if rank == 0 {
					snap, err := testmodel.TakeSnapshot(model.Parameters())
					if err != nil {
						return err
					}
					initial = snap.Context()
				}
				mine := tc.data.rankBatches(inputs, labels, rank)
				err = acc.Join(model, opt, func() error {
					for i, batch := range mine {
						err := acc.Accumulate(func() error {
							if _, err := acc.Backward(model, batch); err != nil {
								return err
							}
							if _, err := opt.Step(); err != nil {
								return err
							}
							return opt.ZeroGrad()
						})
						if err != nil {
							return fmt.Errorf("batch %d: %w", i, err)
						}
					}
					return nil
				})
				if err != nil {
					return err
				}
				params[rank] = model
				finals[rank], err = replicas.VariablesDigest(model.ReplicatedVariables())
				return err
			})
			for rank := range ranks {
				assert.Equal(t, finals[0], finals[rank], "rank %d's replica", rank)
			}
			backend, err := cpu.New(cpu.Config{Backend: "go"})
			require.NoError(t, err)
			steps := tc.data.reference(inputs, labels, tc.k)
			require.NoError(t, testmodel.ReferenceTrain(backend, initial, tc.kind, steps))
			worst, name, err := testmodel.MaxRelativeError(params[0].Parameters(), initial)
			require.NoError(t, err)
			assert.LessOrEqual(t, worst, 1e-5, "variable %s against one process on each step's examples", name)
		})
	}
}

// TestJoinPreparedUnevenLoader: a prepared loader with EvenBatches(false) over 9 examples gives 2 processes
// 3 and 2 batches of 2 (the ranks compare their loaders' settings, but not the number of batches inside
// Join); the process that runs out shadows the other's last step, and every process ends the epoch with
// the same weights, the same number of optimizer steps, and every example used once.
func TestJoinPreparedUnevenLoader(t *testing.T) {
	inputs, labels := testmodel.Data(9, 4)
	digests := make([][32]byte, 2)
	steps := make([]int64, 2)
	used := make([]int, 2)
	lens := make([]int, 2)
	runRanks(t, 2, nil, func(rank int, acc *accel.Accelerator) error {
		model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
		if err != nil {
			return err
		}
		opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.Adam))
		if err != nil {
			return err
		}
		src, err := accel.TensorSource([]*tensors.Tensor{inputs}, []*tensors.Tensor{labels})
		if err != nil {
			return err
		}
		loader, err := acc.PrepareDataLoader(src, accel.BatchSize(2), accel.EvenBatches(false))
		if err != nil {
			return err
		}
		lens[rank] = loader.Len()
		err = acc.Join(model, opt, func() error {
			for batch, err := range loader.All() {
				if err != nil {
					return err
				}
				used[rank] += batch.Size()
				err = acc.Accumulate(func() error {
					if _, err := acc.Backward(model, batch); err != nil {
						return err
					}
					if _, err := opt.Step(); err != nil {
						return err
					}
					return opt.ZeroGrad()
				})
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		steps[rank] = opt.Steps()
		digests[rank], err = replicas.VariablesDigest(model.ReplicatedVariables())
		return err
	})
	assert.Equal(t, []int{3, 2}, lens, "batches per rank, as the loader counts them")
	assert.Equal(t, 9, used[0]+used[1], "every example once")
	assert.Equal(t, []int64{3, 3}, steps, "the process with 2 batches took part in the third step")
	assert.Equal(t, digests[0], digests[1])
}

// Two processes with 3 and 1 batches: inside Join the second takes part in the first's last two optimizer
// steps with zero gradients, so both take 3 steps and end with the same weights. (The processes here are
// goroutines of one in-process group.)
func ExampleAccelerator_Join() {
	comms, err := backends.NewInProcessGroup(2)
	if err != nil {
		fmt.Println(err)
		return
	}
	inputs, labels := testmodel.Data(8, 1)
	data := unevenData{batches: []int{3, 1}, sizes: []int{2, 2}}
	steps := make([]int64, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Go(func() {
			acc, err := accel.New(accel.WithCommunicator(comms[rank]))
			if err != nil {
				panic(err)
			}
			defer acc.Close()
			model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
			if err != nil {
				panic(err)
			}
			opt, err := acc.PrepareOptimizer(model, optimizers.Adam().Done())
			if err != nil {
				panic(err)
			}
			mine := data.rankBatches(inputs, labels, rank)
			if err := model.Materialize(mine[0]); err != nil {
				panic(err)
			}
			err = acc.Join(model, opt, func() error { return trainOn(acc, model, opt, mine) })
			if err != nil {
				panic(err)
			}
			steps[rank] = opt.Steps()
		})
	}
	wg.Wait()
	fmt.Println("optimizer steps:", steps)
	// Output: optimizer steps: [3 3]
}

// trainOn is the loop a program writes over its own batches: Backward, then the optimizer's Step and
// ZeroGrad, for each batch.
func trainOn(acc *accel.Accelerator, model *prepare.Model, opt *prepare.Optimizer, batches []prepare.Batch) error {
	for _, batch := range batches {
		if _, err := acc.Backward(model, batch); err != nil {
			return err
		}
		if _, err := opt.Step(); err != nil {
			return err
		}
		if err := opt.ZeroGrad(); err != nil {
			return err
		}
	}
	return nil
}
