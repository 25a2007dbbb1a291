package accel_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gomlxbackends "github.com/gomlx/gomlx/backends"
	_ "github.com/gomlx/gomlx/backends/simplego"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/batchnorm"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// exportHiddenParam sizes exportMLP's hidden layer from the context's hyperparameters, so that a model
// loaded without them would not even build.
const exportHiddenParam = "export_hidden"

// exportMLP has what an export must keep (weights, batch normalisation's moving averages, a hyperparameter)
// and what it must leave out (dropout draws random numbers; Adam keeps moments).
func exportMLP(ctx *context.Context, in []*Node) []*Node {
	hidden := context.GetParamOr(ctx, exportHiddenParam, 3)
	h := layers.Dense(ctx.In("hidden"), in[0], true, hidden)
	// GoMLX's pure-Go backend has no BatchNormForInference (goaccel's adds it): normalise with graph ops,
	// so that GoMLX alone runs the loaded model.
	h = Tanh(batchnorm.New(ctx.In("hidden"), h, -1).UseBackendInference(false).Done())
	h = layers.DropoutStatic(ctx, h, 0.2)
	return []*Node{layers.Dense(ctx.In("output"), h, true, testmodel.Classes)}
}

// plainGoMLXPredict loads the export in dir with GoMLX alone, into a fresh context, and runs modelFn on x
// in inference mode. immediate loads every variable up front; otherwise the variables take their values
// from the checkpoint as the model function creates them.
func plainGoMLXPredict(t *testing.T, dir string, immediate bool, modelFn func(*context.Context, []*Node) []*Node,
	x *tensors.Tensor) (*tensors.Tensor, *context.Context) {
	t.Helper()
	backend, err := gomlxbackends.NewWithConfig("go")
	require.NoError(t, err)
	ctx := context.New()
	build := checkpoints.Build(ctx).Dir(dir)
	if immediate {
		build = build.Immediate()
	}
	_, err = build.Done()
	require.NoError(t, err)
	// Reuse: the variables exist (immediate) or the checkpoint holds them (lazily loaded), and a checked
	// context refuses to create either anew.
	exec, err := context.NewExec(backend, ctx.Reuse(), func(ctx *context.Context, x *Node) *Node {
		ctx.SetTraining(x.Graph(), false)
		return modelFn(ctx, []*Node{x})[0]
	})
	require.NoError(t, err)
	// x may live on the accelerator's backend: GoMLX wants a tensor per backend instance.
	local, err := x.LocalClone()
	require.NoError(t, err)
	out, err := exec.Exec(local)
	require.NoError(t, err)
	return out[0], ctx
}

// TestSaveModelLoadsInPlainGoMLX: a model trained on 2 ranks with Adam, dropout and batch normalisation,
// exported with SaveModel, loads in GoMLX alone — a fresh context, checkpoints.Build, the same model
// function — and predicts bitwise what model.Predict does; the export holds the weights, the moving
// averages and the hyperparameters, and none of the optimizer's state, the accumulators or the generator
// state.
func TestSaveModelLoadsInPlainGoMLX(t *testing.T) {
	const ranks, b = 2, 4
	dir := filepath.Join(t.TempDir(), "model")
	x, y := testmodel.Data(ranks*b*6, 5)
	evalX, _ := testmodel.Data(10, 9)
	var predicted *tensors.Tensor
	var trained []string // the context's variables after training, every kind
	var weights []string // those the export must hold
	runRanks(t, ranks, []accel.Option{accel.WithSeed(3), accel.WithGradientAccumulationSteps(2)},
		func(rank int, acc *accel.Accelerator) error {
			ctx := context.New()
			ctx.SetParam(exportHiddenParam, 5)
			model, err := acc.PrepareModel(ctx, exportMLP, testmodel.Loss)
			if err != nil {
				return err
			}
			opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.Adam))
			if err != nil {
				return err
			}
			src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
			if err != nil {
				return err
			}
			loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(b), prepare.Shuffle())
			if err != nil {
				return err
			}
			for epoch := range 2 {
				loader.SetEpoch(epoch)
				for batch, err := range loader.All() {
					if err != nil {
						return err
					}
					if err := acc.Accumulate(func() error {
						if _, err := acc.Backward(model, batch); err != nil {
							return err
						}
						if _, err := opt.Step(); err != nil {
							return err
						}
						return opt.ZeroGrad()
					}); err != nil {
						return err
					}
				}
			}
			if err := acc.SaveModel(model, dir); err != nil {
				return err
			}
			if rank != 0 {
				return nil
			}
			for v := range ctx.IterVariables() {
				trained = append(trained, v.ScopeAndName())
			}
			for _, v := range model.Parameters() {
				weights = append(weights, v.ScopeAndName())
			}
			for _, v := range model.Buffers() {
				weights = append(weights, v.ScopeAndName())
			}
			out, err := model.Predict(evalX)
			if err == nil {
				predicted = out[0]
			}
			return err
		})
	require.NotNil(t, predicted)

	// What training left in the context, of every kind the export leaves out.
	for _, kind := range []string{"/AdamOptimizer/", "/goaccel/", "/optimizers/", "global_step", "#rngState"} {
		require.True(t, slices.ContainsFunc(trained, func(name string) bool { return strings.Contains(name, kind) }),
			"the trained context has no %q variable: the test would prove nothing about it", kind)
	}
	require.NotEmpty(t, weights)

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Len(t, names, 2, "one GoMLX checkpoint: its .json and .bin (got %v)", names)
	for _, name := range names {
		assert.Regexp(t, `^checkpoint-n\d+-\d{8}-\d{6}-step-\d{8}\.(json|bin)$`, name)
	}

	for _, immediate := range []bool{false, true} {
		t.Run(fmt.Sprintf("immediate=%v", immediate), func(t *testing.T) {
			got, ctx := plainGoMLXPredict(t, dir, immediate, exportMLP, evalX)
			// Bitwise: the same graph on the same pure-Go kernels, from the same weights.
			assert.Equal(t, predicted.Shape(), got.Shape())
			assert.Equal(t, tensors.MustCopyFlatData[float32](predicted), tensors.MustCopyFlatData[float32](got))
			var loaded []string
			for v := range ctx.IterVariables() {
				loaded = append(loaded, v.ScopeAndName())
			}
			if immediate { // exactly what the checkpoint holds
				assert.ElementsMatch(t, weights, loaded)
			} else { // what the model function created, all from the checkpoint
				assert.Subset(t, loaded, weights)
			}
			hidden, found := ctx.GetParam(exportHiddenParam)
			assert.True(t, found)
			assert.EqualValues(t, 5, hidden)
		})
	}

	jsonFile := filepath.Join(dir, names[slices.IndexFunc(names, func(n string) bool { return strings.HasSuffix(n, ".json") })])
	data, err := os.ReadFile(jsonFile)
	require.NoError(t, err)
	for _, kind := range []string{"AdamOptimizer", "moment", "goaccel", "bucket", "optimizers", "global_step", "rngState"} {
		assert.NotContains(t, string(data), kind)
	}
}

// TestSaveModelReplacesAnEarlierExport: a second export replaces the first (one checkpoint in the
// directory, the newer weights), and a directory that holds anything else is refused, untouched.
func TestSaveModelReplacesAnEarlierExport(t *testing.T) {
	acc := newSingle(t, accel.WithSeed(1))
	model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
	require.NoError(t, err)
	opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.SGD))
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "export")
	require.ErrorContains(t, acc.SaveModel(model, dir), "no weights yet")

	loader := loaderFor(t, acc, 8, 4)
	x, _ := testmodel.Data(4, 2)
	var last *tensors.Tensor
	for range 2 {
		for batch, err := range loader.All() {
			require.NoError(t, err)
			_, err = acc.Backward(model, batch)
			require.NoError(t, err)
			_, err = opt.Step()
			require.NoError(t, err)
			require.NoError(t, opt.ZeroGrad())
		}
		require.NoError(t, acc.SaveModel(model, dir))
		out, err := model.Predict(x)
		require.NoError(t, err)
		last = out[0]
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	assert.Contains(t, entries[0].Name(), "-step-00000004")
	got, _ := plainGoMLXPredict(t, dir, true, testmodel.MLP, x)
	assert.Equal(t, tensors.MustCopyFlatData[float32](last), tensors.MustCopyFlatData[float32](got))
	siblings, err := os.ReadDir(filepath.Dir(dir))
	require.NoError(t, err)
	assert.Len(t, siblings, 1, "no temporary directory left beside the export")

	other := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(other, "notes.txt"), []byte("mine"), 0o644))
	err = acc.SaveModel(model, other)
	require.ErrorContains(t, err, `holds "notes.txt"`)
	data, err := os.ReadFile(filepath.Join(other, "notes.txt"))
	require.NoError(t, err)
	assert.Equal(t, "mine", string(data))

	require.ErrorContains(t, acc.SaveModel(model, dir, accel.SaveModelExcluding("output")), "not absolute")
	require.ErrorContains(t, acc.SaveModel(nil, dir), "model is nil")
}

// TestSaveModelExcluding: the scopes given are left out, and the rest still loads.
func TestSaveModelExcluding(t *testing.T) {
	acc := newSingle(t, accel.WithSeed(1))
	model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
	require.NoError(t, err)
	loader := loaderFor(t, acc, 4, 4)
	batch, err := loader.PeekBatch()
	require.NoError(t, err)
	require.NoError(t, model.Materialize(batch))
	dir := filepath.Join(t.TempDir(), "export")
	require.NoError(t, acc.SaveModel(model, dir, accel.SaveModelExcluding("/output")))
	ctx := context.New()
	_, err = checkpoints.Build(ctx).Dir(dir).Immediate().Done()
	require.NoError(t, err)
	var loaded []string
	for v := range ctx.IterVariables() {
		loaded = append(loaded, v.ScopeAndName())
	}
	assert.ElementsMatch(t, []string{"/hidden/dense/weights", "/hidden/dense/biases"}, loaded)
}

// SaveModel exports the trained weights alone; GoMLX loads them into a fresh context, with no goaccel
// package, and the same model function predicts what the prepared model does.
func ExampleAccelerator_SaveModel() {
	dir, _ := os.MkdirTemp("", "goaccel-export")
	defer os.RemoveAll(dir)
	acc, _ := accel.New(accel.WithSeed(1))
	defer acc.Close()
	model, _ := acc.PrepareModel(context.New(), linear, losses.MeanSquaredError)
	opt, _ := acc.PrepareOptimizer(model, optimizers.Adam().Done())
	loader, _ := acc.PrepareDataLoader(lineData(16), accel.BatchSize(4))
	for batch := range loader.All() {
		_, _ = acc.Backward(model, batch)
		_, _ = opt.Step()
		_ = opt.ZeroGrad()
	}
	if err := acc.SaveModel(model, filepath.Join(dir, "model")); err != nil { // every process calls it
		fmt.Println(err)
		return
	}

	// Inference with GoMLX alone: a fresh context, the checkpoint, the same model function.
	ctx := context.New()
	if _, err := checkpoints.Build(ctx).Dir(filepath.Join(dir, "model")).Done(); err != nil {
		fmt.Println(err)
		return
	}
	backend, _ := gomlxbackends.NewWithConfig("go")
	predict, _ := context.NewExec(backend, ctx.Reuse(), func(ctx *context.Context, x *Node) *Node {
		return linear(ctx, []*Node{x})[0]
	})
	x := []float32{-0.5, 0, 0.5}
	got, _ := predict.Exec(tensors.FromFlatDataAndDimensions(x, 3, 1))
	want, _ := model.Predict(tensors.FromFlatDataAndDimensions(x, 3, 1))
	fmt.Println("same predictions:", slices.Equal(tensors.MustCopyFlatData[float32](got[0]),
		tensors.MustCopyFlatData[float32](want[0])))
	var names []string
	for v := range ctx.IterVariables() {
		names = append(names, v.ScopeAndName())
	}
	slices.Sort(names)
	fmt.Println(names)
	// Output:
	// same predictions: true
	// [/linear/dense/biases /linear/dense/weights]
}

// SaveModelExcluding leaves scopes out of the export: here the state of a hand-written optimizer kept in
// "/ema", which GoMLX's own optimizers would not have left in the model's context.
func ExampleSaveModelExcluding() {
	dir, _ := os.MkdirTemp("", "goaccel-export")
	defer os.RemoveAll(dir)
	acc, _ := accel.New(accel.WithSeed(1))
	defer acc.Close()
	ctx := context.New()
	model, _ := acc.PrepareModel(ctx, linear, losses.MeanSquaredError)
	loader, _ := acc.PrepareDataLoader(lineData(4), accel.BatchSize(4))
	batch, _ := loader.PeekBatch()
	_ = model.Materialize(batch)
	ctx.InAbsPath("/ema").VariableWithValue("weights", []float32{0}).SetTrainable(false)

	err := acc.SaveModel(model, filepath.Join(dir, "model"), accel.SaveModelExcluding("/ema"))
	fmt.Println("error:", err)
	loaded := context.New()
	_, _ = checkpoints.Build(loaded).Dir(filepath.Join(dir, "model")).Immediate().Done()
	var names []string
	for v := range loaded.IterVariables() {
		names = append(names, v.ScopeAndName())
	}
	slices.Sort(names)
	fmt.Println(names)
	// Output:
	// error: <nil>
	// [/linear/dense/biases /linear/dense/weights]
}
