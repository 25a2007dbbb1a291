package prepare_test

import (
	"fmt"
	"math"
	"sync"
	"testing"

	gomlxbackends "github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/fnn"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/prepare"
)

const dropoutFeatures = 8

// dropoutModels are GoMLX's dropout layers, each in a small regression model on [batch, 8] inputs.
var dropoutModels = []struct {
	name  string
	model prepare.ModelFn
}{
	{"layers.DropoutStatic", func(ctx *context.Context, in []*Node) []*Node {
		x := Tanh(layers.Dense(ctx.In("hidden"), in[0], true, 16))
		x = layers.DropoutStatic(ctx, x, 0.5)
		return []*Node{layers.Dense(ctx.In("output"), x, true, 1)}
	}},
	{"layers.Dropout", func(ctx *context.Context, in []*Node) []*Node {
		x := Tanh(layers.Dense(ctx.In("hidden"), in[0], true, 16))
		x = layers.Dropout(ctx, x, Scalar(x.Graph(), dtypes.Float32, 0.3))
		return []*Node{layers.Dense(ctx.In("output"), x, true, 1)}
	}},
	{"fnn.Dropout", func(ctx *context.Context, in []*Node) []*Node {
		return []*Node{fnn.New(ctx.In("fnn"), in[0], 1).NumHiddenLayers(2, 16).Dropout(0.3).Done()}
	}},
	// Blocks of 1 pixel: larger ones pool a boolean mask (a MinPool), which GoMLX's pure-Go backend cannot
	// run by itself.
	{"layers.DropBlock", func(ctx *context.Context, in []*Node) []*Node {
		x := layers.Dense(ctx.In("hidden"), in[0], true, 4*4*2)
		x = Reshape(x, -1, 4, 4, 2)
		x = layers.DropBlock(ctx, x).WithDropoutProbability(0.5).WithBlockSize(1).Done()
		return []*Node{layers.Dense(ctx.In("output"), Reshape(x, -1, 4*4*2), true, 1)}
	}},
	{"MultiHeadAttention.Dropout", func(ctx *context.Context, in []*Node) []*Node {
		x := Reshape(layers.Dense(ctx.In("embed"), in[0], true, 4*8), -1, 4, 8)
		x = layers.MultiHeadAttention(ctx.In("attention"), x, x, x, 2, 4).Dropout(0.3).Done()
		return []*Node{layers.Dense(ctx.In("output"), ReduceMean(x, 1), true, 1)}
	}},
}

var (
	dropoutBackendOnce sync.Once
	dropoutBackend     gomlxbackends.Backend
	dropoutBackendErr  error
)

// dropoutRuntimes returns one Runtime per rank of an in-process group, each with its gradient state.
func dropoutRuntimes(t *testing.T, ranks, k int) []*prepare.Runtime {
	t.Helper()
	dropoutBackendOnce.Do(func() { dropoutBackend, dropoutBackendErr = cpu.New(cpu.Config{Backend: "go"}) })
	require.NoError(t, dropoutBackendErr)
	comms, err := backends.NewInProcessGroup(ranks)
	require.NoError(t, err)
	rts := make([]*prepare.Runtime, ranks)
	for r, comm := range comms {
		state, err := accumulate.NewGradientState(k, false)
		require.NoError(t, err)
		rts[r] = &prepare.Runtime{Backend: dropoutBackend, Comm: comm, State: state}
	}
	t.Cleanup(func() {
		for _, rt := range rts {
			assert.NoError(t, rt.Comm.Close())
		}
	})
	return rts
}

// dropoutBatch is a deterministic regression batch of n examples.
func dropoutBatch(n, seed int) prepare.Batch {
	x := make([]float32, n*dropoutFeatures)
	y := make([]float32, n)
	for i := range x {
		x[i] = float32(math.Sin(float64(i*7 + seed*13)))
	}
	for i := range y {
		y[i] = float32(math.Cos(float64(i + seed)))
	}
	return prepare.Batch{Inputs: []*tensors.Tensor{tensors.FromFlatDataAndDimensions(x, n, dropoutFeatures)},
		Labels: []*tensors.Tensor{tensors.FromFlatDataAndDimensions(y, n, 1)}}
}

func flat(t *testing.T, ts []*tensors.Tensor) []float32 {
	t.Helper()
	var out []float32
	for _, x := range ts {
		values, err := tensors.CopyFlatData[float32](x)
		require.NoError(t, err)
		out = append(out, values...)
	}
	return out
}

// TestDropoutTrains: every GoMLX dropout layer trains through a prepared model with Adam and SGD on the
// pure-Go backend (the first Backward used to fail with `unknown dtype "InvalidDType"`, from the memory
// estimate of the random generator's two-output node). Backward runs in training mode and draws masks
// (predictions differ from Predict's, the generator state advances); Predict runs without dropout (the
// same outputs twice, the generator untouched).
func TestDropoutTrains(t *testing.T) {
	for _, tc := range dropoutModels {
		for _, opt := range []struct {
			name string
			new  func() optimizers.Interface
		}{
			{"Adam", func() optimizers.Interface { return optimizers.Adam().LearningRate(0.01).Done() }},
			{"SGD", func() optimizers.Interface { return optimizers.StochasticGradientDescent() }},
		} {
			t.Run(tc.name+"/"+opt.name, func(t *testing.T) {
				rt := dropoutRuntimes(t, 1, 1)[0]
				ctx := context.New()
				require.NoError(t, ctx.SetRNGStateFromSeed(5))
				model, err := prepare.NewModel(rt, ctx, tc.model, losses.MeanSquaredError)
				require.NoError(t, err)
				o, err := prepare.NewOptimizer(model, opt.new())
				require.NoError(t, err)
				batch := dropoutBatch(6, 1)
				require.NoError(t, model.Materialize(batch))
				before, err := replicas.VariablesDigest(model.Parameters())
				require.NoError(t, err)
				for step := range 3 {
					rng, err := model.RNGState()
					require.NoError(t, err)
					require.NotNil(t, rng)
					predicted, err := model.Predict(batch.Inputs...)
					require.NoError(t, err)
					again, err := model.Predict(batch.Inputs...)
					require.NoError(t, err)
					assert.Equal(t, flat(t, predicted), flat(t, again), "step %d: Predict must not drop out", step)
					afterPredict, err := model.RNGState()
					require.NoError(t, err)
					assert.Equal(t, rng, afterPredict, "step %d: Predict drew random numbers", step)

					res, err := model.BackwardOutputs(batch, rt.State.MicroBatchScale())
					require.NoError(t, err)
					assert.False(t, math.IsNaN(res.Loss) || math.IsInf(res.Loss, 0), "step %d: loss %g", step, res.Loss)
					assert.NotEqual(t, flat(t, predicted), flat(t, res.Outputs), "step %d: Backward must drop out", step)
					afterBackward, err := model.RNGState()
					require.NoError(t, err)
					assert.NotEqual(t, rng, afterBackward, "step %d: Backward drew no random numbers", step)
					stepped, err := o.Step()
					require.NoError(t, err)
					require.True(t, stepped)
					require.NoError(t, o.ZeroGrad())
				}
				after, err := replicas.VariablesDigest(model.Parameters())
				require.NoError(t, err)
				assert.NotEqual(t, before, after, "the weights moved")
			})
		}
	}
}

// TestTrainingFlag: the graphs Backward (with and without outputs) runs are built with GoMLX's training
// flag on, Predict's with it off, which is what every dropout layer reads.
func TestTrainingFlag(t *testing.T) {
	rt := dropoutRuntimes(t, 1, 1)[0]
	var flags []bool
	model, err := prepare.NewModel(rt, context.New(), func(ctx *context.Context, in []*Node) []*Node {
		flags = append(flags, ctx.IsTraining(in[0].Graph()))
		return []*Node{layers.Dense(ctx.In("output"), in[0], true, 1)}
	}, losses.MeanSquaredError)
	require.NoError(t, err)
	opt, err := prepare.NewOptimizer(model, optimizers.StochasticGradientDescent())
	require.NoError(t, err)
	batch := dropoutBatch(4, 2)
	for _, tc := range []struct {
		name     string
		run      func() error
		training bool
	}{
		{"Backward", func() error {
			if _, err := model.Backward(batch, 1); err != nil {
				return err
			}
			return opt.ZeroGrad()
		}, true},
		{"BackwardOutputs", func() error {
			if _, err := model.BackwardOutputs(batch, 1); err != nil {
				return err
			}
			return opt.ZeroGrad()
		}, true},
		{"Predict", func() error { _, err := model.Predict(batch.Inputs...); return err }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flags = nil
			require.NoError(t, tc.run())
			require.NotEmpty(t, flags, "a graph was built")
			for _, f := range flags {
				assert.Equal(t, tc.training, f)
			}
		})
	}
}

// TestUntrainableModelsAreNamed: a model that cannot be trained fails on its first Backward with an error
// naming what it cannot train — the operation without a gradient, the integer variable — never with an
// internal error of the graph's bookkeeping; dropout is not among them any more.
func TestUntrainableModelsAreNamed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		model prepare.ModelFn
		want  []string // substrings of the error; none: it trains
	}{
		{"dropout", dropoutModels[0].model, nil},
		{"operation without a gradient", func(ctx *context.Context, in []*Node) []*Node {
			x := layers.Dense(ctx.In("hidden"), in[0], true, 4)
			return []*Node{layers.Dense(ctx.In("output"), Mod(x, OnesLike(x)), true, 1)}
		}, []string{"differentiating the loss", `"Rem"`, "no gradient"}},
		{"integer trainable variable", func(ctx *context.Context, in []*Node) []*Node {
			counts := ctx.VariableWithShape("counts", shapes.Make(dtypes.Int32, 1))
			x := layers.Dense(ctx.In("hidden"), in[0], true, 4)
			x = Add(x, ConvertDType(ReduceAllSum(counts.ValueGraph(x.Graph())), dtypes.Float32))
			return []*Node{layers.Dense(ctx.In("output"), x, true, 1)}
		}, []string{`"/counts"`, "Int32"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := dropoutRuntimes(t, 1, 1)[0]
			model, err := prepare.NewModel(rt, context.New(), tc.model, losses.MeanSquaredError)
			require.NoError(t, err)
			_, err = prepare.NewOptimizer(model, optimizers.Adam().Done())
			require.NoError(t, err)
			_, err = model.Backward(dropoutBatch(4, 3), 1)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.NotContains(t, err.Error(), "InvalidDType")
			for _, want := range tc.want {
				assert.Contains(t, err.Error(), want)
			}
		})
	}
}

// TestRanksDrawTheirOwnMasks: on N in-process ranks each rank's generator state is rank 0's derived with
// its rank (rank 0 keeping it) as soon as the model is built, the ranks draw different masks, and their
// weights stay bitwise identical, because only the averaged gradients reach them. The state is not among
// the replicated variables.
func TestRanksDrawTheirOwnMasks(t *testing.T) {
	const steps = 3
	for _, ranks := range []int{2, 4} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			rts := dropoutRuntimes(t, ranks, 1)
			initial := make([][]uint64, ranks)
			final := make([][]uint64, ranks)
			digests := make([][32]byte, ranks)
			losses0 := make([]float64, ranks)
			errs := make([]error, ranks)
			var wg sync.WaitGroup
			for r, rt := range rts {
				wg.Go(func() {
					errs[r] = func() error {
						ctx := context.New()
						// Each rank starts from its own state: rank 0's is broadcast before the derivation.
						if err := ctx.SetRNGStateFromSeed(int64(100 + r)); err != nil {
							return err
						}
						model, err := prepare.NewModel(rt, ctx, dropoutModels[2].model, losses.MeanSquaredError)
						if err != nil {
							return err
						}
						opt, err := prepare.NewOptimizer(model, optimizers.Adam().Done())
						if err != nil {
							return err
						}
						batch := dropoutBatch(4, 7) // the same batch everywhere: only the masks differ
						if err := model.Materialize(batch); err != nil {
							return err
						}
						for _, v := range model.ReplicatedVariables() {
							if v == model.RNGVariable() {
								return fmt.Errorf("the generator state is among the replicated variables")
							}
						}
						if initial[r], err = model.RNGState(); err != nil {
							return err
						}
						for step := range steps {
							loss, err := model.Backward(batch, 1)
							if err != nil {
								return err
							}
							if step == 0 {
								losses0[r] = loss
							}
							if _, err := opt.Step(); err != nil {
								return err
							}
						}
						if final[r], err = model.RNGState(); err != nil {
							return err
						}
						digests[r], err = replicas.VariablesDigest(model.ReplicatedVariables())
						return err
					}()
					if errs[r] != nil {
						rt.Comm.Abort(1)
					}
				})
			}
			wg.Wait()
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
			for r := range ranks {
				assert.Equal(t, prepare.DeriveRNGState(initial[0], r), initial[r], "rank %d's initial state", r)
				assert.Equal(t, digests[0], digests[r], "rank %d's weights differ from rank 0's", r)
				for q := range r {
					assert.NotEqual(t, final[q], final[r], "ranks %d and %d share a generator", q, r)
					assert.NotEqual(t, losses0[q], losses0[r], "ranks %d and %d drew the same masks", q, r)
				}
			}
		})
	}
}

// TestRNGStateDerivation: DeriveRNGState leaves rank 0's state and gives every other rank another one,
// the same for the same base and rank; RankRNGState takes a saved rank's own state where the saving run
// had that rank and derives it from saved rank 0's elsewhere, and refuses states of the wrong size.
func TestRNGStateDerivation(t *testing.T) {
	base := []uint64{1, 2, 3}
	assert.Equal(t, base, prepare.DeriveRNGState(base, 0))
	seen := map[[3]uint64]int{}
	for r := range 64 {
		s := prepare.DeriveRNGState(base, r)
		require.Len(t, s, 3)
		assert.Equal(t, s, prepare.DeriveRNGState(base, r), "deterministic")
		key := [3]uint64(s)
		if q, ok := seen[key]; ok {
			t.Errorf("ranks %d and %d derive the same state", q, r)
		}
		seen[key] = r
	}
	assert.Equal(t, []uint64{1, 2, 3}, base, "the base is not changed")
	assert.NotEqual(t, prepare.DeriveRNGState([]uint64{1, 2, 3}, 1), prepare.DeriveRNGState([]uint64{1, 2, 4}, 1))

	saved := [][]uint64{{10, 11, 12}, {20, 21, 22}}
	for _, tc := range []struct {
		name  string
		saved [][]uint64
		rank  int
		want  []uint64
		err   string
	}{
		{"rank 0 takes its own", saved, 0, saved[0], ""},
		{"rank 1 takes its own", saved, 1, saved[1], ""},
		{"a new rank derives from rank 0", saved, 2, prepare.DeriveRNGState(saved[0], 2), ""},
		{"one saved rank", saved[:1], 3, prepare.DeriveRNGState(saved[0], 3), ""},
		{"nothing saved", nil, 0, nil, "no random number generator state"},
		{"a short state", [][]uint64{{1, 2}}, 0, nil, "rank 0: prepare: a random number generator state of 2 words"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := prepare.RankRNGState(tc.saved, tc.rank)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestModelWithoutRNG: a model whose context has no generator state (nothing random, not even its
// initializers) reports none and ignores a state to set.
func TestModelWithoutRNG(t *testing.T) {
	rt := dropoutRuntimes(t, 1, 1)[0]
	ctx := context.New().WithInitializer(func(g *Graph, shape shapes.Shape) *Node { return Zeros(g, shape) })
	model, err := prepare.NewModel(rt, ctx, func(ctx *context.Context, in []*Node) []*Node {
		return []*Node{layers.Dense(ctx.In("output"), in[0], true, 1)}
	}, losses.MeanSquaredError)
	require.NoError(t, err)
	_, err = model.Backward(dropoutBatch(2, 1), 1)
	require.NoError(t, err)
	assert.Nil(t, model.RNGVariable())
	state, err := model.RNGState()
	require.NoError(t, err)
	assert.Nil(t, state)
	assert.NoError(t, model.SetRNGState([]uint64{1, 2, 3}))
}
