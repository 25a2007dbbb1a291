package accel

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	"github.com/goaccel/goaccel/prepare"
)

// SaveModelOption configures SaveModel.
type SaveModelOption func(*saveModelConfig)

type saveModelConfig struct {
	excludeScopes []string
}

// SaveModelExcluding leaves out of SaveModel's export the variables in the given absolute scopes
// ("/ema" leaves out "/ema" and "/ema/…"): the state of an optimizer that is not GoMLX's own, or anything
// else of the context that inference does not need.
func SaveModelExcluding(scopes ...string) SaveModelOption {
	return func(c *saveModelConfig) { c.excludeScopes = append(c.excludeScopes, scopes...) }
}

// SaveModel exports model's weights to dir, for inference with GoMLX alone (Accelerate's save_model). It
// writes the variables of the model's context in GoMLX's checkpoint format, with the context's
// hyperparameters (those that are JSON values), and leaves out what only training needs: goaccel's
// gradient accumulators, the random number generator state, and the optimizer's state — the variables in
// GoMLX's "optimizers" scopes (learning rate, schedules), every "global_step", and the moments GoMLX's Adam
// keeps for each parameter (its whole scope, "/AdamOptimizer" by default). Loader positions, registered
// values and the run's configuration are SaveState's; a model saved with SaveModel cannot resume training,
// only predict. The model's buffers (batch normalisation's moving averages) are kept: inference needs them.
//
// A plain GoMLX program loads the export into a fresh context and runs the same model function (with
// Reuse: a checked context refuses to create the variables the checkpoint holds):
//
//	ctx := context.New()
//	_, err := checkpoints.Build(ctx).Dir(dir).Done()
//	exec, err := context.NewExec(backend, ctx.Reuse(), func(ctx *context.Context, x *graph.Node) *graph.Node {
//		ctx.SetTraining(x.Graph(), false)
//		return modelFn(ctx, []*graph.Node{x})[0]
//	})
//
// dir holds the export alone: it is created if absent, and an earlier export in it is replaced (a directory
// holding anything but GoMLX checkpoint files is refused, so that nothing else is deleted). The export is
// written beside dir and renamed into place, so dir holds the previous export or the new one, never a mix.
//
// Collective: every rank calls it, with the same model; the main process writes its own weights (which
// every rank holds after an optimizer step, buffers included unless the model keeps them per rank), and
// every rank returns once the export is durable, or with the main process's error.
func (a *Accelerator) SaveModel(model *prepare.Model, dir string, opts ...SaveModelOption) error {
	if err := a.checkModel(model); err != nil {
		return err
	}
	if !model.Materialized() {
		return errors.New("accel: saving the model: it has no weights yet (run a step first)")
	}
	if dir == "" {
		return errors.New("accel: saving the model: no directory given")
	}
	var cfg saveModelConfig
	for _, opt := range opts {
		opt(&cfg)
	}
	for _, scope := range cfg.excludeScopes {
		if !strings.HasPrefix(scope, context.ScopeSeparator) {
			return fmt.Errorf("accel: saving the model: scope %q to exclude is not absolute (it must start with %q)",
				scope, context.ScopeSeparator)
		}
	}
	var saveErr error
	if a.IsMainProcess() {
		saveErr = a.writeModel(model, dir, cfg)
	}
	if a.WorldSize() == 1 {
		return saveErr
	}
	// The broadcast doubles as the barrier: no rank returns before the export is durable.
	status, err := broadcastBytes(a.comm, []byte(errorText(saveErr)))
	if err != nil {
		return fmt.Errorf("accel: saving the model: %w", err)
	}
	if msg, _ := splitStatus(status); msg != "" {
		if saveErr != nil {
			return saveErr
		}
		return fmt.Errorf("accel: saving the model (main process): %s", msg)
	}
	return nil
}

// writeModel writes the export into a new directory beside dir and renames it into place (main process).
func (a *Accelerator) writeModel(model *prepare.Model, dir string, cfg saveModelConfig) (err error) {
	dir = filepath.Clean(dir)
	if err := checkExportDir(dir); err != nil {
		return err
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("accel: saving the model: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("accel: saving the model: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	if err := saveModelVariables(tmp, exportedVariables(model, cfg), model.Context(), a.optimizerSteps(model)); err != nil {
		return err
	}
	if err := syncDirFiles(tmp); err != nil {
		return fmt.Errorf("accel: saving the model: %w", err)
	}
	return replaceDir(tmp, dir)
}

// optimizerSteps is the number of optimizer steps applied to model (0 without an optimizer): it names the
// export's files as GoMLX names a checkpoint's, by its global step.
func (a *Accelerator) optimizerSteps(model *prepare.Model) int64 {
	var steps int64
	for _, o := range a.optimizers {
		if o.Model() == model {
			steps = max(steps, o.Steps())
		}
	}
	return steps
}

// exportedVariables are the variables of model's context that SaveModel writes: all but goaccel's
// accumulators, the random number generator state, the optimizers' state and the scopes cfg excludes.
func exportedVariables(model *prepare.Model, cfg saveModelConfig) []*context.Variable {
	ctx := model.Context()
	skip := map[*context.Variable]bool{}
	for _, v := range model.Reducer().Accumulators() {
		skip[v] = true
	}
	if rng := model.RNGVariable(); rng != nil {
		skip[rng] = true
	}
	excluded := append([]string{goaccelScope}, cfg.excludeScopes...)
	excluded = append(excluded, adamScopes(ctx)...)
	var vars []*context.Variable
	for v := range ctx.IterVariables() {
		switch {
		case skip[v], v.Name() == context.RNGStateVariableName, v.Name() == optimizers.GlobalStepVariableName,
			inOptimizersScope(v.Scope()), inAnyScope(v.Scope(), excluded):
			continue
		}
		vars = append(vars, v)
	}
	return vars
}

// goaccelScope is where goaccel keeps its own variables in a model's context (the gradient accumulators).
const goaccelScope = "/goaccel"

// inOptimizersScope reports whether scope is inside one of GoMLX's optimizer scopes ("optimizers" at any
// depth): the learning rate, and what schedules keep.
func inOptimizersScope(scope string) bool {
	for _, part := range strings.Split(scope, context.ScopeSeparator) {
		if part == optimizers.Scope {
			return true
		}
	}
	return false
}

// inAnyScope reports whether scope is one of scopes or inside one of them.
func inAnyScope(scope string, scopes []string) bool {
	for _, s := range scopes {
		s = strings.TrimSuffix(s, context.ScopeSeparator)
		if s == "" { // the root: everything
			return true
		}
		if scope == s || strings.HasPrefix(scope, s+context.ScopeSeparator) {
			return true
		}
	}
	return false
}

// Names GoMLX's Adam gives the moments it keeps for each parameter: "<name>_1st_moment" and
// "<name>_2nd_moment", in the scope "/<Adam's scope><the parameter's scope>".
const (
	adamFirstMoment  = "_1st_moment"
	adamSecondMoment = "_2nd_moment"
)

// adamScopes are the top-level scopes where GoMLX's Adam keeps its moments in ctx: the scope of each
// non-trainable "<p>_1st_moment" or "<p>_2nd_moment" variable that sits at "/<scope>" followed by the scope
// of a trainable variable named <p>. Adam's scope is configurable (AdamConfig.Scope), so it is found
// rather than assumed.
func adamScopes(ctx *context.Context) []string {
	trainable := map[string][]string{} // name → scopes of the trainable variables of that name
	for v := range ctx.IterVariables() {
		if v.Trainable {
			trainable[v.Name()] = append(trainable[v.Name()], v.Scope())
		}
	}
	seen := map[string]bool{}
	var scopes []string
	for v := range ctx.IterVariables() {
		if v.Trainable {
			continue
		}
		name, ok := strings.CutSuffix(v.Name(), adamFirstMoment)
		if !ok {
			if name, ok = strings.CutSuffix(v.Name(), adamSecondMoment); !ok {
				continue
			}
		}
		for _, paramScope := range trainable[name] {
			if top, ok := adamTopScope(v.Scope(), paramScope); ok && !seen[top] {
				seen[top] = true
				scopes = append(scopes, top)
			}
		}
	}
	return scopes
}

// adamTopScope returns "/<scope>" when momentScope is "/<scope>" followed by paramScope (one scope level
// above the parameter's).
func adamTopScope(momentScope, paramScope string) (string, bool) {
	sep := context.ScopeSeparator
	var top string
	if paramScope == context.RootScope {
		top = strings.TrimSuffix(momentScope, sep)
	} else {
		var ok bool
		if top, ok = strings.CutSuffix(momentScope, paramScope); !ok {
			return "", false
		}
	}
	if !strings.HasPrefix(top, sep) || len(top) == len(sep) || strings.Contains(top[len(sep):], sep) {
		return "", false
	}
	return top, true
}

// saveModelVariables writes vars (and ctx's hyperparameters) to dir, an empty directory, with GoMLX's
// checkpoints package. It builds a fresh context holding only them, so the training context is left as it
// is and nothing else is written; the fresh context's global step, which names the files, is not saved.
func saveModelVariables(dir string, vars []*context.Variable, ctx *context.Context, steps int64) (err error) {
	defer recoverInto(&err, "saving the model")
	export := context.New().Checked(false)
	for _, v := range vars {
		value, err := v.Value()
		if err != nil {
			return fmt.Errorf("accel: saving the model: variable %q: %w", v.ScopeAndName(), err)
		}
		export.InAbsPath(v.Scope()).VariableWithValue(v.Name(), value).SetTrainable(v.Trainable)
	}
	ctx.EnumerateParams(func(scope, key string, value any) {
		if _, err := json.Marshal(value); err == nil { // GoMLX writes them as JSON
			export.InAbsPath(scope).SetParam(key, value)
		}
	})
	globalStep := optimizers.GetGlobalStepVar(export)
	globalStep.MustSetValue(tensors.FromScalar(steps))
	h, err := checkpoints.Build(export).Dir(dir).Done()
	if err != nil {
		return fmt.Errorf("accel: saving the model: %w", err)
	}
	h.ExcludeVarsFromSaving(globalStep)
	if err := h.Save(); err != nil {
		return fmt.Errorf("accel: saving the model: %w", err)
	}
	return nil
}

// checkExportDir refuses a dir that SaveModel must not replace: one that is not a directory, or one that
// holds anything but GoMLX checkpoint files (an earlier export).
func checkExportDir(dir string) error {
	info, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("accel: saving the model: %w", err)
	}
	if !info.IsDir() {
		return fmt.Errorf("accel: saving the model: %s is not a directory", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("accel: saving the model: %w", err)
	}
	for _, e := range entries {
		if !isCheckpointFile(e) {
			return fmt.Errorf("accel: saving the model: %s holds %q, which is not part of an exported model: "+
				"export into a new or empty directory, or one that holds an earlier export", dir, e.Name())
		}
	}
	return nil
}

// isCheckpointFile reports whether e is one of the files GoMLX's checkpoints package writes.
func isCheckpointFile(e os.DirEntry) bool {
	name := e.Name()
	return e.Type().IsRegular() && strings.HasPrefix(name, "checkpoint-") &&
		(strings.HasSuffix(name, checkpoints.JsonNameSuffix) || strings.HasSuffix(name, checkpoints.BinDataSuffix))
}

// syncDirFiles flushes every file of dir, and dir itself, to disk.
func syncDirFiles(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := syncFile(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return syncFile(dir)
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	return errors.Join(err, f.Close())
}

// replaceDir puts the directory tmp in dir's place: an existing dir is moved aside first and removed once
// tmp is in place.
func replaceDir(tmp, dir string) error {
	parent := filepath.Dir(dir)
	var old string
	if _, err := os.Stat(dir); err == nil {
		aside, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".old-")
		if err != nil {
			return fmt.Errorf("accel: saving the model: %w", err)
		}
		old = filepath.Join(aside, filepath.Base(dir))
		if err := os.Rename(dir, old); err != nil {
			_ = os.Remove(aside)
			return fmt.Errorf("accel: saving the model: %w", err)
		}
		defer os.RemoveAll(aside)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if old != "" {
			_ = os.Rename(old, dir) // put the previous export back
		}
		return fmt.Errorf("accel: saving the model: %w", err)
	}
	if err := syncFile(parent); err != nil {
		return fmt.Errorf("accel: saving the model: %w", err)
	}
	return nil
}
