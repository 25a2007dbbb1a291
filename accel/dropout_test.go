package accel_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/fnn"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// dropoutForms are GoMLX's dropout layers inside classifiers of testmodel's data (testmodel.Features inputs,
// testmodel.Classes classes).
var dropoutForms = []struct {
	name  string
	model prepare.ModelFn
}{
	{"layers.DropoutStatic", dropoutMLP},
	{"fnn.Dropout", func(ctx *context.Context, in []*Node) []*Node {
		return []*Node{fnn.New(ctx.In("fnn"), in[0], testmodel.Classes).NumHiddenLayers(2, 12).Dropout(0.3).Done()}
	}},
	{"layers.DropBlock", func(ctx *context.Context, in []*Node) []*Node {
		x := Reshape(layers.Dense(ctx.In("hidden"), in[0], true, 4*4*2), -1, 4, 4, 2)
		// Blocks of one pixel: larger ones pool a boolean mask, which the pure-Go backend cannot run.
		x = layers.DropBlock(ctx, x).WithDropoutProbability(0.4).WithBlockSize(1).Done()
		return []*Node{layers.Dense(ctx.In("output"), Reshape(x, -1, 4*4*2), true, testmodel.Classes)}
	}},
	{"MultiHeadAttention.Dropout", func(ctx *context.Context, in []*Node) []*Node {
		x := Reshape(layers.Dense(ctx.In("embed"), in[0], true, 4*8), -1, 4, 8)
		x = layers.MultiHeadAttention(ctx.In("attention"), x, x, x, 2, 4).Dropout(0.3).Done()
		return []*Node{layers.Dense(ctx.In("output"), ReduceMean(x, 1), true, testmodel.Classes)}
	}},
}

// dropoutMLP is testmodel's MLP with dropout on its hidden layer.
func dropoutMLP(ctx *context.Context, in []*Node) []*Node {
	h := Tanh(layers.Dense(ctx.In("hidden"), in[0], true, 16))
	h = layers.DropoutStatic(ctx, h, 0.3)
	return []*Node{layers.Dense(ctx.In("output"), h, true, testmodel.Classes)}
}

func dropoutAdam() optimizers.Interface { return optimizers.Adam().LearningRate(0.01).Done() }

// copyForTrainer copies the model's parameters and its generator state into a fresh context for GoMLX's
// Trainer; rng replaces the state when not nil.
func copyForTrainer(t *testing.T, model *prepare.Model, rng []uint64) *context.Context {
	t.Helper()
	ref := context.New()
	require.NoError(t, testmodel.CopyParams(ref, model.Parameters()))
	if rng == nil {
		var err error
		rng, err = model.RNGState()
		require.NoError(t, err)
	}
	ref.InAbsPath(context.RootScope).Checked(false).
		VariableWithValue(context.RNGStateVariableName, tensors.FromFlatDataAndDimensions(rng, len(rng))).
		SetTrainable(false)
	return ref
}

// TestDropoutMatchesTrainer: every dropout form trains through PrepareModel with Adam on one process to
// the weights GoMLX's own Trainer reaches from the same weights and generator state — the same masks, in
// the same order — and a Trainer started from another generator state ends elsewhere, so the masks count.
func TestDropoutMatchesTrainer(t *testing.T) {
	const b, steps = 4, 4
	backend, err := cpu.New(cpu.Config{Backend: "go"})
	require.NoError(t, err)
	inputs, labels := testmodel.Data(b*steps, 21)
	batches := testmodel.ReferenceBatches(inputs, labels, b, 1)
	for _, form := range dropoutForms {
		t.Run(form.name, func(t *testing.T) {
			acc := newSingle(t, accel.WithSeed(5))
			model, err := acc.PrepareModel(context.New(), form.model, testmodel.Loss)
			require.NoError(t, err)
			opt, err := acc.PrepareOptimizer(model, dropoutAdam())
			require.NoError(t, err)
			require.NoError(t, model.Materialize(batchOf(batches[0][0], batches[0][1])))
			ref := copyForTrainer(t, model, nil)
			rng, err := model.RNGState()
			require.NoError(t, err)
			other := copyForTrainer(t, model, prepare.DeriveRNGState(rng, 1))
			for _, batch := range batches {
				_, err := acc.Backward(model, batchOf(batch[0], batch[1]))
				require.NoError(t, err)
				stepped, err := opt.Step()
				require.NoError(t, err)
				require.True(t, stepped)
				require.NoError(t, opt.ZeroGrad())
			}
			for _, ctx := range []*context.Context{ref, other} {
				trainer := train.NewTrainer(backend, ctx.Checked(false),
					func(ctx *context.Context, _ any, in []*Node) []*Node { return form.model(ctx, in) },
					testmodel.Loss, dropoutAdam(), nil, nil)
				for i, batch := range batches {
					_, err := trainer.TrainStep(nil, []*tensors.Tensor{batch[0]}, []*tensors.Tensor{batch[1]})
					require.NoError(t, err, "reference step %d", i)
				}
			}
			worst, name, err := testmodel.MaxRelativeError(model.Parameters(), ref)
			require.NoError(t, err)
			assert.LessOrEqual(t, worst, 1e-5, "variable %s", name)
			worst, _, err = testmodel.MaxRelativeError(model.Parameters(), other)
			require.NoError(t, err)
			assert.Greater(t, worst, 1e-4, "other masks must give other weights")
		})
	}
}

// dropoutRun is what one rank of a dropout run reports.
type dropoutRun struct {
	Initial, Final []uint64 // the generator state once the model is built, and at the end
	Digest         [32]byte // the replicated variables at the end
}

// trainDropout trains dropoutMLP with Adam on acc for the given optimizer steps of K=2 micro-batches of 2
// examples per rank, each rank on its own examples, checking the replicas after every step.
func trainDropout(acc *accel.Accelerator, steps int) (dropoutRun, error) {
	var run dropoutRun
	const k, b = 2, 2
	model, err := acc.PrepareModel(context.New(), dropoutMLP, testmodel.Loss)
	if err != nil {
		return run, err
	}
	opt, err := acc.PrepareOptimizer(model, dropoutAdam())
	if err != nil {
		return run, err
	}
	n := acc.WorldSize() * k * b * steps
	x, y := testmodel.Data(n, 17)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	if err != nil {
		return run, err
	}
	loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(b))
	if err != nil {
		return run, err
	}
	first, err := loader.PeekBatch()
	if err == nil {
		err = model.Materialize(first)
	}
	if err != nil {
		return run, err
	}
	if run.Initial, err = model.RNGState(); err != nil {
		return run, err
	}
	for batch, err := range loader.All() {
		if err != nil {
			return run, err
		}
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
			return run, err
		}
	}
	if opt.Steps() != int64(steps) {
		return run, fmt.Errorf("%d optimizer steps, want %d", opt.Steps(), steps)
	}
	if run.Final, err = model.RNGState(); err != nil {
		return run, err
	}
	run.Digest, err = replicas.VariablesDigest(model.ReplicatedVariables())
	return run, err
}

// checkDropoutRanks: each rank took rank 0's built state derived with its rank, the ranks ended with
// different generators (their own masks) and the same weights.
func checkDropoutRanks(t *testing.T, runs []dropoutRun) {
	t.Helper()
	for r, run := range runs {
		assert.Equal(t, prepare.DeriveRNGState(runs[0].Initial, r), run.Initial, "rank %d's initial state", r)
		assert.NotEqual(t, run.Initial, run.Final, "rank %d drew no random numbers", r)
		assert.Equal(t, runs[0].Digest, run.Digest, "rank %d's weights differ from rank 0's", r)
		for q := range r {
			assert.NotEqual(t, runs[q].Final, run.Final, "ranks %d and %d share a generator", q, r)
		}
	}
}

// TestDropoutAcrossRanks: dropout trains on 1, 2 and 4 in-process ranks with the replica check on after
// every step; each rank draws its own masks (docs/semantics.md §11); a run is reproducible from its seed,
// and another seed gives other weights.
func TestDropoutAcrossRanks(t *testing.T) {
	const steps = 3
	for _, ranks := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			bySeed := map[uint64][]dropoutRun{}
			for _, seed := range []uint64{7, 7, 8} {
				runs := make([]dropoutRun, ranks)
				runRanks(t, ranks, []accel.Option{accel.WithGradientAccumulationSteps(2), accel.WithSeed(seed),
					accel.WithReplicaCheck()}, func(rank int, acc *accel.Accelerator) error {
					var err error
					runs[rank], err = trainDropout(acc, steps)
					return err
				})
				checkDropoutRanks(t, runs)
				if earlier, ok := bySeed[seed]; ok {
					assert.Equal(t, earlier, runs, "the same seed must give the same run")
				}
				bySeed[seed] = runs
			}
			assert.NotEqual(t, bySeed[7][0].Digest, bySeed[8][0].Digest, "another seed, other weights")
		})
	}
}

// dropoutResumable trains dropoutMLP from a loader of n examples, batch 2, as the resume tests need.
type dropoutResumable struct {
	model  *prepare.Model
	opt    *prepare.Optimizer
	loader *prepare.DataLoader
}

func prepareDropoutResumable(acc *accel.Accelerator, n int) (dropoutResumable, error) {
	var r dropoutResumable
	var err error
	if r.model, err = acc.PrepareModel(context.New(), dropoutMLP, testmodel.Loss); err != nil {
		return r, err
	}
	if r.opt, err = acc.PrepareOptimizer(r.model, dropoutAdam()); err != nil {
		return r, err
	}
	x, y := testmodel.Data(n, 23)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	if err != nil {
		return r, err
	}
	r.loader, err = acc.PrepareDataLoader(src, prepare.BatchSize(2), prepare.Shuffle())
	return r, err
}

// train runs from the loader's place to the end of epochs, stopping after stopAfter micro-batches (> 0).
func (r dropoutResumable) train(acc *accel.Accelerator, epochs, stopAfter int) error {
	ran := 0
	for epoch := r.loader.Epoch(); epoch < epochs; epoch++ {
		r.loader.SetEpoch(epoch)
		for batch, err := range r.loader.All() {
			if err != nil {
				return err
			}
			err = acc.Accumulate(func() error {
				if _, err := acc.Backward(r.model, batch); err != nil {
					return err
				}
				if _, err := r.opt.Step(); err != nil {
					return err
				}
				return r.opt.ZeroGrad()
			})
			if err != nil {
				return err
			}
			if ran++; ran == stopAfter {
				return nil
			}
		}
	}
	return nil
}

// report is the rank's generator state and replicated variables' digest.
func (r dropoutResumable) report() (dropoutRun, error) {
	state, err := r.model.RNGState()
	if err != nil {
		return dropoutRun{}, err
	}
	d, err := replicas.VariablesDigest(r.model.ReplicatedVariables())
	return dropoutRun{Final: state, Digest: d}, err
}

// savedRNGStates reads model 0's per-rank generator states from the newest checkpoint under dir.
func savedRNGStates(t *testing.T, dir string) [][]uint64 {
	t.Helper()
	path, err := checkpoint.Latest(dir)
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(path, "state.json"))
	require.NoError(t, err)
	var s struct {
		Models []struct {
			RNGStates [][]uint64 `json:"rng_states"`
		} `json:"models"`
	}
	require.NoError(t, json.Unmarshal(data, &s))
	require.Len(t, s.Models, 1)
	return s.Models[0].RNGStates
}

// withoutRNGStates writes under root a copy of the newest checkpoint under dir whose state.json has no
// rng_states, as checkpoints of earlier versions: their variables hold rank 0's generator state only.
func withoutRNGStates(t *testing.T, dir, root string) {
	t.Helper()
	src, err := checkpoint.Latest(dir)
	require.NoError(t, err)
	_, err = checkpoint.Write(root, 0, func(tmp string) error {
		return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
			rel, _ := filepath.Rel(src, path)
			switch {
			case err != nil:
				return err
			case d.IsDir():
				return os.MkdirAll(filepath.Join(tmp, rel), 0o755)
			case rel == checkpoint.ManifestFile:
				return nil
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if rel == "state.json" {
				var m map[string]any
				dec := json.NewDecoder(bytes.NewReader(data))
				dec.UseNumber() // keeps the 64-bit counts exact
				if err := dec.Decode(&m); err != nil {
					return err
				}
				for _, model := range m["models"].([]any) {
					delete(model.(map[string]any), "rng_states")
				}
				if data, err = json.Marshal(m); err != nil {
					return err
				}
			}
			return os.WriteFile(filepath.Join(tmp, rel), data, 0o644)
		})
	})
	require.NoError(t, err)
}

// TestDropoutResumeIsBitwiseExact: with dropout, on 1 and 2 in-process ranks (K=2), a run that stops
// inside an accumulation cycle and an epoch, saves and resumes in fresh accelerators ends with bitwise
// the weights and generator states of the run that never stopped: every rank's state is in the
// checkpoint. A copy of the checkpoint without the per-rank states (what earlier versions wrote) still
// loads: each rank derives its state from the saved rank 0's, so one rank resumes exactly and on two the
// other masks rank 1 draws end elsewhere.
func TestDropoutResumeIsBitwiseExact(t *testing.T) {
	const k, epochs, stopAfter = 2, 2, 6
	for _, ranks := range []int{1, 2} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			n := ranks * 2 * 5
			dir, old := t.TempDir(), t.TempDir()
			opts := []accel.Option{accel.WithGradientAccumulationSteps(k), accel.WithSeed(3)}
			phase := func(load string, stop int, save bool) []dropoutRun {
				runs := make([]dropoutRun, ranks)
				runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
					r, err := prepareDropoutResumable(acc, n)
					if err != nil {
						return err
					}
					if load != "" {
						if err := acc.LoadState(load); err != nil {
							return err
						}
					}
					if err := r.train(acc, epochs, stop); err != nil {
						return err
					}
					if save {
						if _, err := acc.SaveState(dir); err != nil {
							return err
						}
					}
					runs[rank], err = r.report()
					return err
				})
				return runs
			}
			straight := phase("", 0, false)
			saved := phase("", stopAfter, true)
			states := savedRNGStates(t, dir)
			require.Len(t, states, ranks)
			for r := range ranks {
				assert.Equal(t, saved[r].Final, states[r], "rank %d's state in the checkpoint", r)
			}
			resumed := phase(dir, 0, false)
			assert.Equal(t, straight, resumed, "the resumed run must end bitwise as the straight one")
			assert.NotEqual(t, saved[0].Digest, resumed[0].Digest, "the resumed run trained")

			withoutRNGStates(t, dir, old)
			fromOld := phase(old, 0, false)
			for r := range ranks {
				assert.Equal(t, fromOld[0].Digest, fromOld[r].Digest, "rank %d: replicas", r)
			}
			if ranks == 1 {
				assert.Equal(t, straight, fromOld, "one rank's state is the one among the variables")
			} else {
				assert.NotEqual(t, straight[0].Digest, fromOld[0].Digest,
					"without the saved states the ranks but 0 draw other masks")
			}
		})
	}
}

// TestDropoutResumeOnAnotherWorldSize: a checkpoint saved at an optimizer-step boundary by 2 ranks loads on
// 3 ranks and on 1 (docs/checkpointing.md): rank r takes saved rank r's generator state where the saving
// run had a rank r, and saved rank 0's derived with r elsewhere; the weights are the saved ones.
func TestDropoutResumeOnAnotherWorldSize(t *testing.T) {
	dir := t.TempDir()
	const n = 24
	opts := []accel.Option{accel.WithSeed(13)}
	saved := make([]dropoutRun, 2)
	runRanks(t, 2, opts, func(rank int, acc *accel.Accelerator) error {
		r, err := prepareDropoutResumable(acc, n)
		if err != nil {
			return err
		}
		if err := r.train(acc, 1, 3); err != nil {
			return err
		}
		if _, err := acc.SaveState(dir); err != nil {
			return err
		}
		saved[rank], err = r.report()
		return err
	})
	require.NotEqual(t, saved[0].Final, saved[1].Final)
	for _, ranks := range []int{3, 1} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			loaded := make([]dropoutRun, ranks)
			runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
				r, err := prepareDropoutResumable(acc, n)
				if err != nil {
					return err
				}
				if err := acc.LoadState(dir); err != nil {
					return err
				}
				loaded[rank], err = r.report()
				return err
			})
			for r := range ranks {
				want := prepare.DeriveRNGState(saved[0].Final, r)
				if r < len(saved) {
					want = saved[r].Final
				}
				assert.Equal(t, want, loaded[r].Final, "rank %d's generator state", r)
				assert.Equal(t, saved[0].Digest, loaded[r].Digest, "rank %d's weights", r)
			}
		})
	}
}

// TestFormat1CheckpointsGiveEachRankItsGenerator: the format-1 checkpoints of testdata, written by 2
// processes before checkpoints held per-rank generator states, load with rank 0 taking the state their
// variables hold and rank 1 that state derived with its rank.
func TestFormat1CheckpointsGiveEachRankItsGenerator(t *testing.T) {
	const ranks = 2
	for _, dir := range []string{"testdata/format1/mid-cycle", "testdata/format1/epoch-end"} {
		t.Run(dir, func(t *testing.T) {
			states := make([][]uint64, ranks)
			runRanks(t, ranks, []accel.Option{accel.WithGradientAccumulationSteps(3), accel.WithSeed(7)},
				func(rank int, acc *accel.Accelerator) error {
					r := prepareResumable(t, acc, ranks*2*11, 2, 1)
					// The saving run drew no random numbers after initialising, as this one: move the
					// generator, for the check to see which state the checkpoint gave.
					if err := r.model.Materialize(must(r.loader.PeekBatch())); err != nil {
						return err
					}
					if err := r.model.SetRNGState([]uint64{9, 9, 9}); err != nil {
						return err
					}
					if err := acc.LoadState(dir); err != nil {
						return err
					}
					var err error
					states[rank], err = r.model.RNGState()
					return err
				})
			h, err := checkpoints.Load(context.New()).Dir(filepath.Join(dir, "model-0")).ExcludeAllParams().Done()
			require.NoError(t, err)
			saved, ok := h.LoadedVariables()[prepare.RNGStateParameterName]
			require.True(t, ok, "the checkpoint's variables hold a generator state")
			assert.Equal(t, tensors.MustCopyFlatData[uint64](saved), states[0])
			assert.Equal(t, prepare.DeriveRNGState(states[0], 1), states[1])
		})
	}
}
