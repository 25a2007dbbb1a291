package accel

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/internal/heap"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/prepare"
	"github.com/goaccel/goaccel/userstate"
)

// LoadState restores the newest checkpoint under dir (or dir itself, if it is a checkpoint) saved by
// SaveState with the same seed, models, optimizers, data loaders and registered values. The next iteration
// of each data loader resumes on the first example the saved run had not consumed.
//
// A checkpoint taken at an optimizer-step boundary resumes on any number of processes, with any K and
// per-process batch size: the data position is global (the examples of each epoch's order consumed), the
// accumulators were empty and the optimizer state is replicated. When the new run takes as many examples
// per optimizer step as the saved one (N'·K'·b' = N·K·b), it takes the same steps over the same examples
// as a run that never stopped; otherwise it says so in one line on the accelerator's output, with both
// global batches (the learning rate is not rescaled). A checkpoint taken inside an accumulation cycle holds
// every process's partial gradients: it resumes, bitwise, only on the same number of processes, K, batch
// size and sync-each-batch, and is refused elsewhere with an error that says to save at a step boundary.
//
// Collective: the main process reads the checkpoint and broadcasts it, so the other processes need no
// access to the files (nodes without a shared filesystem work) — except a run under a sharding strategy,
// each of whose processes reads its own blocks of the optimizer state from the files (docs/sharding.md). Models are built first if needed, from the
// first batch of the first prepared data loader.
//
// LoadState changes nothing unless it succeeds on every rank: each rank checks the checkpoint against its
// own run — every variable's name, dtype and shape, the optimizers' types, the seed, the loaders' datasets,
// every counter and position, and every registered value's bytes, which it unmarshals into a fresh value
// first — and the ranks agree that all of them accept it before any applies it; the registered values are
// set first, and set back on every rank if one of them still refuses. A refusal is the same error on
// every rank, naming the ranks that refused and why. Without any checkpoint under dir the error wraps
// checkpoint.ErrNoCheckpoint on every rank (a program that resumes when it can starts afresh then). When
// the newest checkpoint under dir is incomplete or damaged, LoadState falls back to the newest intact one
// and says so on the accelerator's output (see WithOutput).
func (a *Accelerator) LoadState(dir string) error {
	defer a.timeline.span("load checkpoint", a.timeline.now())
	if err := a.checkOpen(); err != nil {
		return err
	}
	if err := a.agreeOnLoading(); err != nil {
		return err
	}
	if err := a.materializeForLoad(); err != nil {
		return err
	}
	var payload []byte
	var readErr error
	if a.IsMainProcess() {
		payload, readErr = a.readCheckpoint(dir)
	}
	status, err := broadcastBytes(a.comm, encodeReadError(readErr))
	if err != nil {
		return fmt.Errorf("accel: loading state: %w", err)
	}
	if len(status) > 0 {
		return fmt.Errorf("accel: loading state (main process): %w; nothing was changed", decodeReadError(status))
	}
	if payload, err = broadcastBytes(a.comm, payload); err != nil {
		return fmt.Errorf("accel: loading state: %w", err)
	}
	plan, planErr := a.planLoad(payload)
	if err := replicas.Agree(a.comm, "accel: loading state refused, nothing was changed", planErr); err != nil {
		return err
	}
	for _, skipped := range plan.skipped {
		a.Printf("accel: %s; loading the newest intact checkpoint, %s\n", skipped, plan.path)
	}
	// The program's values first: they are the only part whose unmarshalling can still fail, and the ranks
	// agree on the outcome before the library's own state changes.
	applyErr := plan.user.Apply()
	if err := replicas.Agree(a.comm, "accel: loading state refused, nothing was changed", applyErr); err != nil {
		if applyErr == nil {
			err = errors.Join(err, plan.user.Undo())
		}
		return err
	}
	if err := a.applyLoad(plan); err != nil {
		// Every rank validated the same checkpoint, so this is not expected; if it happens the ranks may
		// no longer hold the same state, and the job must not go on.
		a.comm.Fail(err)
		return err
	}
	for _, note := range plan.notes {
		a.Printf("accel: %s\n", note)
	}
	records := plan.state.LogRecords
	// The payload every rank received and the values it replaced: a whole model's worth, freed now.
	plan, payload = nil, nil
	heap.Settle()
	// The trackers' files are the main process's alone: a failure to rewrite one is its error, not a
	// divergence of the ranks' training state.
	return a.resumeTrackers(records)
}

// encodeReadError is how the main process tells the others why it could not read a checkpoint: the text,
// marked when there was no checkpoint at all so that every rank's error wraps checkpoint.ErrNoCheckpoint.
func encodeReadError(err error) []byte {
	if err == nil {
		return nil
	}
	mark := "\x00"
	if errors.Is(err, checkpoint.ErrNoCheckpoint) {
		mark = "\x01"
	}
	return []byte(mark + err.Error())
}

func decodeReadError(status []byte) error {
	return readError{msg: string(status[1:]), noCheckpoint: status[0] == 1}
}

// readError is the main process's error reading a checkpoint, as every rank returns it.
type readError struct {
	msg          string
	noCheckpoint bool
}

func (e readError) Error() string { return e.msg }

func (e readError) Is(target error) bool {
	return e.noCheckpoint && target == checkpoint.ErrNoCheckpoint
}

// checkpointPayload is what the main process reads from a checkpoint and broadcasts: everything LoadState
// needs, so the other ranks never touch the files.
type checkpointPayload struct {
	Path    string
	Skipped []string // why newer checkpoints were passed over
	State   []byte   // state.json
	Models  []modelPayload
	User    userstate.Saved
	// Outer are the optimizers' DiLoCo state files (nil where there is none).
	Outer [][]byte
}

type modelPayload struct {
	Variables    []savedVariable
	Accumulators []byte // every rank's, bucket by bucket
	// Local is every rank's variables under local SGD (localFile; nil otherwise).
	Local []byte
}

// savedVariable is one variable of a checkpoint, by its GoMLX parameter name (scope and name).
type savedVariable struct {
	Name  string
	DType dtypes.DType
	Dims  []int
	Data  []byte
}

// loadPlan is a validated checkpoint, ready to apply.
type loadPlan struct {
	path     string
	skipped  []string
	state    savedState
	values   []map[*context.Variable]*tensors.Tensor // per model
	rng      [][]uint64                              // per model, this rank's generator state (nil: keep)
	accums   []accumulate.ReducerState               // per model, this rank's accumulators
	local    []prepare.LocalSGDState                 // per optimizer
	loaders  []prepare.LoaderState                   // per checkpointed loader
	gradient accumulate.Position
	user     *userstate.Restore
	// notes are said on the output once the checkpoint is applied (a global batch that changed).
	notes []string
}

func (a *Accelerator) materializeForLoad() error {
	for i, m := range a.models {
		if m.Materialized() {
			continue
		}
		loaders := a.checkpointedLoaders()
		if len(loaders) == 0 || !loaders[0].Peekable() {
			return fmt.Errorf("accel: loading state: model %d has no weights yet and no data loader to build it "+
				"from: call model.Materialize with a batch first", i)
		}
		batch, err := loaders[0].PeekBatch()
		if err != nil {
			return fmt.Errorf("accel: loading state: %w", err)
		}
		if err := m.Materialize(batch); err != nil {
			return fmt.Errorf("accel: loading state: %w", err)
		}
	}
	return nil
}

// readCheckpoint finds the newest intact checkpoint under dir and reads it into a payload (main process
// only). It reads variables into a scratch context: nothing of this run changes here.
func (a *Accelerator) readCheckpoint(dir string) ([]byte, error) {
	path, skipped, err := checkpoint.LatestIntact(dir)
	if err != nil {
		return nil, err
	}
	p := checkpointPayload{Path: path}
	for _, s := range skipped {
		p.Skipped = append(p.Skipped, s.Error())
	}
	if p.State, err = os.ReadFile(filepath.Join(path, stateFile)); err != nil {
		return nil, err
	}
	state, err := parseState(p.State)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %s: %w", path, stateFile, err)
	}
	if len(state.Models) != len(a.models) {
		return nil, fmt.Errorf("checkpoint %s: saved %d model(s), this run prepared %d", path, len(state.Models),
			len(a.models))
	}
	for i, sm := range state.Models {
		if !filepath.IsLocal(sm.Dir) {
			return nil, fmt.Errorf("checkpoint %s: %s names model directory %q outside the checkpoint", path,
				stateFile, sm.Dir)
		}
		modelDir := filepath.Join(path, sm.Dir)
		vars, err := readVariables(modelDir)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", path, err)
		}
		blob, err := os.ReadFile(filepath.Join(modelDir, accumulatorsFile))
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", path, err)
		}
		// A replicated run takes a sharded checkpoint's optimizer state whole, as it would have saved it. (On
		// another plan the blocks cannot be placed: the check on every rank refuses the plan.)
		m := a.models[i]
		if sm.Sharding != nil && m.Sharding().Stage() == 0 && slices.Equal(sm.Plan, m.Plan().Signature()) {
			slots, err := replicatedSlotVariables(modelDir, *sm.Sharding, a.layout(m))
			if err != nil {
				return nil, fmt.Errorf("checkpoint %s: model %d's blocks of optimizer state: %w", path, i, err)
			}
			vars = append(vars, slots...)
		}
		var local []byte
		if sm.Local != "" {
			if !filepath.IsLocal(sm.Local) {
				return nil, fmt.Errorf("checkpoint %s: %s names file %q outside the checkpoint", path, stateFile, sm.Local)
			}
			if local, err = os.ReadFile(filepath.Join(modelDir, sm.Local)); err != nil {
				return nil, fmt.Errorf("checkpoint %s: %w", path, err)
			}
		}
		p.Models = append(p.Models, modelPayload{Variables: vars, Accumulators: blob, Local: local})
	}
	for _, so := range state.Optimizers {
		var outer []byte
		if so.Outer != "" {
			if !filepath.IsLocal(so.Outer) {
				return nil, fmt.Errorf("checkpoint %s: %s names file %q outside the checkpoint", path, stateFile, so.Outer)
			}
			if outer, err = os.ReadFile(filepath.Join(path, so.Outer)); err != nil {
				return nil, fmt.Errorf("checkpoint %s: %w", path, err)
			}
		}
		p.Outer = append(p.Outer, outer)
	}
	for _, uv := range state.UserValues {
		sv := userstate.SavedValue{Name: uv.Name, PerRank: uv.PerRank}
		for _, file := range uv.Files {
			if !filepath.IsLocal(filepath.FromSlash(file)) {
				return nil, fmt.Errorf("checkpoint %s: %s names file %q outside the checkpoint", path, stateFile, file)
			}
			data, err := os.ReadFile(filepath.Join(path, filepath.FromSlash(file)))
			if err != nil {
				return nil, fmt.Errorf("checkpoint %s: value %q: %w", path, uv.Name, err)
			}
			sv.Data = append(sv.Data, data)
		}
		p.User.Values = append(p.User.Values, sv)
	}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(p); err != nil {
		return nil, fmt.Errorf("checkpoint %s: encoding it for the other ranks: %w", path, err)
	}
	return buf.Bytes(), nil
}

// readVariables reads the variables GoMLX's checkpoints package saved in dir, sorted by name, without
// putting them in any context of this run.
func readVariables(dir string) (vars []savedVariable, err error) {
	defer recoverInto(&err, "reading variables")
	scratch := context.New()
	h, err := checkpoints.Load(scratch).Dir(dir).ExcludeAllParams().Done()
	if err != nil {
		return nil, err
	}
	loaded := h.LoadedVariables()
	names := make([]string, 0, len(loaded))
	for name := range loaded {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t := loaded[name]
		sv := savedVariable{Name: name, DType: t.DType(), Dims: slices.Clone(t.Shape().Dimensions)}
		if err := t.ConstBytes(func(data []byte) { sv.Data = slices.Clone(data) }); err != nil {
			return nil, fmt.Errorf("variable %q: %w", name, err)
		}
		vars = append(vars, sv)
	}
	return vars, nil
}

// planLoad checks a broadcast checkpoint against this rank's run and prepares what applyLoad sets. It
// changes nothing.
func (a *Accelerator) planLoad(payload []byte) (*loadPlan, error) {
	var p checkpointPayload
	if err := gob.NewDecoder(bytes.NewReader(payload)).Decode(&p); err != nil {
		return nil, fmt.Errorf("decoding the checkpoint the main process sent: %w", err)
	}
	plan := &loadPlan{path: p.Path, skipped: p.Skipped}
	var err error
	if plan.state, err = parseState(p.State); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %s: %w", p.Path, stateFile, err)
	}
	if err := a.check(plan, p); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", p.Path, err)
	}
	return plan, nil
}

func (a *Accelerator) check(plan *loadPlan, p checkpointPayload) error {
	s := plan.state
	if err := a.compatible(s); err != nil {
		return err
	}
	if len(p.Models) != len(a.models) {
		return fmt.Errorf("holds %d model(s), this run prepared %d", len(p.Models), len(a.models))
	}
	saved := make([]accumulate.SavedAccumulators, len(s.Models))
	for i := range s.Models {
		saved[i] = s.Models[i].SavedAccumulators
	}
	blobs := make([][]byte, len(p.Models))
	for i := range p.Models {
		blobs[i] = p.Models[i].Accumulators
	}
	reducers := make([]*accumulate.Reducer, len(a.models))
	for i, m := range a.models {
		reducers[i] = m.Reducer()
	}
	cycle, err := a.state.PlanResume(s.SavedCycle, saved, blobs, reducers, a.WorldSize())
	if err != nil {
		return err
	}
	plan.gradient, plan.accums = cycle.Position, cycle.Reducers
	for i, m := range a.models {
		saved := p.Models[i].Variables
		var blocks map[*context.Variable]*tensors.Tensor
		if m.Sharding().Stage() > 0 {
			// This run keeps its optimizer state in blocks: read them from the checkpoint's blocks, or cut
			// them from its replicated variables.
			var err error
			if blocks, saved, err = blockValues(a.layout(m), p.Path, s.Models[i], saved); err != nil {
				return fmt.Errorf("model %d: %w", i, err)
			}
		}
		values, savedRNG, err := matchVariables(m, saved)
		if err != nil {
			return fmt.Errorf("model %d: %w", i, err)
		}
		maps.Copy(values, blocks)
		plan.values = append(plan.values, values)
		rng, err := a.rngStateFor(m, s.Models[i].RNGStates, savedRNG)
		if err != nil {
			return fmt.Errorf("model %d: %w", i, err)
		}
		plan.rng = append(plan.rng, rng)
	}
	if err := a.planLocalSGD(plan, p); err != nil {
		return err
	}
	loaders := a.checkpointedLoaders()
	for i, l := range loaders {
		state, note, err := a.loaderState(s, i, l, cycle.AtStepBoundary)
		if err == nil {
			err = l.CheckRestore(state)
		}
		if err != nil {
			return fmt.Errorf("data loader %d: %w", i, err)
		}
		if note != "" && len(loaders) > 1 {
			note = fmt.Sprintf("data loader %d: %s", i, note)
		}
		if note != "" {
			plan.notes = append(plan.notes, note)
		}
		plan.loaders = append(plan.loaders, state)
	}
	user, err := a.userState.Plan(p.User, a.Rank(), a.WorldSize())
	if err != nil {
		return err
	}
	plan.user = user
	return nil
}

// loaderState reads the saved place of checkpointed loader i for l, and says whether this run takes
// another number of examples per optimizer step than the saved one did.
func (a *Accelerator) loaderState(s savedState, i int, l *prepare.DataLoader, atBoundary bool) (prepare.LoaderState, string, error) {
	sl := s.Loaders[i]
	savedBatch := sl.BatchSize
	if savedBatch == 0 { // older checkpoints did not record it: they resume on the same settings
		savedBatch = l.BatchSize()
	}
	if s.Format == 1 {
		if sl.BatchSize != 0 && sl.BatchSize != l.BatchSize() {
			return prepare.LoaderState{}, "", fmt.Errorf("was saved with batch size %d per process, this run uses "+
				"%d: a format-1 checkpoint's position counts batches of the saved size", sl.BatchSize, l.BatchSize())
		}
		if sl.Batches != 0 && sl.Batches != l.Len() {
			return prepare.LoaderState{}, "", fmt.Errorf("had %d batches per epoch per process in the saved run, %d "+
				"in this one: the dataset differs", sl.Batches, l.Len())
		}
		state, err := l.StateAfterBatches(sl.Epoch, sl.Position)
		return state, "", err
	}
	if sl.Examples != 0 && sl.Examples != l.SourceLen() {
		return prepare.LoaderState{}, "", fmt.Errorf("had %d examples in the saved run, %d in this one: the "+
			"dataset differs", sl.Examples, l.SourceLen())
	}
	if !atBoundary && savedBatch != l.BatchSize() {
		return prepare.LoaderState{}, "", fmt.Errorf("%w and was saved with batch size %d per process, this run "+
			"uses %d: the partial gradients are means over batches of the saved size; save at an optimizer-step "+
			"boundary to resume with another batch size", accumulate.ErrInsideCycle, savedBatch, l.BatchSize())
	}
	var note string
	saved, now := s.WorldSize*s.Steps*savedBatch, a.WorldSize()*a.state.Steps()*l.BatchSize()
	if saved != now {
		note = fmt.Sprintf("the global batch changed: the checkpoint's run took %d examples per optimizer step (%s), "+
			"this one takes %d (%s); the learning rate is not rescaled", saved,
			globalBatch(s.WorldSize, s.Steps, savedBatch), now,
			globalBatch(a.WorldSize(), a.state.Steps(), l.BatchSize()))
	}
	return prepare.LoaderState{Epoch: sl.Epoch, Consumed: sl.Consumed}, note, nil
}

// compatible checks the parts of a saved state that must match this run whatever its size.
func (a *Accelerator) compatible(s savedState) error {
	switch {
	case s.Format != 1 && s.Format != stateFormat:
		return fmt.Errorf("state format %d, this version reads 1 and %d", s.Format, stateFormat)
	case s.Format == 1 && s.WorldSize != a.WorldSize():
		return fmt.Errorf("saved by %d processes, this run has %d: the checkpoint is of state format 1, which "+
			"records per-process batch positions; resume it with %d processes (checkpoints this version saves "+
			"resume on any number)", s.WorldSize, a.WorldSize(), s.WorldSize)
	case s.WorldSize < 1:
		return fmt.Errorf("saved by %d processes", s.WorldSize)
	case s.Seed != a.cfg.seed:
		return fmt.Errorf("saved with seed %d, this run uses %d: the data order would not continue the saved "+
			"run's", s.Seed, a.cfg.seed)
	case len(s.Models) != len(a.models):
		return fmt.Errorf("saved %d model(s), this run prepared %d", len(s.Models), len(a.models))
	}
	for i, m := range a.models {
		if saved, current, differ := replicas.FirstDifference(s.Models[i].Plan, m.Plan().Signature()); differ {
			return fmt.Errorf("model %d differs from the saved one: saved %q, this run has %q", i, saved, current)
		}
	}
	if loaders := a.checkpointedLoaders(); len(s.Optimizers) != len(a.optimizers) || len(s.Loaders) != len(loaders) {
		return fmt.Errorf("saved %d optimizer(s) and %d loader(s); this run prepared %d and %d (a loader that only "+
			"some runs prepare, such as one made inside an evaluation function, belongs out of checkpoints: "+
			"prepare it with prepare.SkipCheckpoint())", len(s.Optimizers), len(s.Loaders), len(a.optimizers), len(loaders))
	}
	for i, o := range a.optimizers {
		so := s.Optimizers[i]
		if kind := o.State().Kind; so.Kind != "" && so.Kind != kind {
			return fmt.Errorf("optimizer %d is a %s in the checkpoint and a %s in this run: its state cannot be "+
				"loaded into another optimizer", i, so.Kind, kind)
		}
		if so.Model < 0 || so.Model >= len(a.models) || a.models[so.Model] != o.Model() {
			return fmt.Errorf("optimizer %d belongs to model %d in the checkpoint, not to the same model in this run",
				i, so.Model)
		}
		if so.Steps < 0 || so.Skipped < 0 {
			return fmt.Errorf("optimizer %d has negative step counts (%d applied, %d skipped)", i, so.Steps, so.Skipped)
		}
	}
	return nil
}

// matchVariables pairs the saved variables with the model's: the same names, and each with the same
// dtype and shape. It returns the values to set, and the random number generator state among the saved
// variables (rank 0's; nil when there is none), which is not a replicated variable.
func matchVariables(m *prepare.Model, saved []savedVariable) (map[*context.Variable]*tensors.Tensor, []uint64, error) {
	live := map[string]*context.Variable{}
	for _, v := range checkpointedVariables(m) {
		live[v.ParameterName()] = v
	}
	values := make(map[*context.Variable]*tensors.Tensor, len(saved))
	var rng []uint64
	for _, sv := range saved {
		if sv.Name == prepare.RNGStateParameterName {
			var err error
			if rng, err = savedRNGState(sv); err != nil {
				return nil, nil, err
			}
			continue
		}
		v, ok := live[sv.Name]
		if !ok {
			return nil, nil, fmt.Errorf("the checkpoint holds variable %q, which this run does not have: it was "+
				"saved with another model or optimizer", sv.Name)
		}
		got, want := shapes.Make(sv.DType, sv.Dims...), v.Shape()
		if !got.Equal(want) {
			return nil, nil, fmt.Errorf("variable %q is %s in the checkpoint and %s in this run", sv.Name, got, want)
		}
		if int64(len(sv.Data)) != int64(got.Memory()) {
			return nil, nil, fmt.Errorf("variable %q has %d bytes in the checkpoint, its shape %s needs %d", sv.Name,
				len(sv.Data), got, got.Memory())
		}
		t := tensors.FromShape(got)
		if err := t.MutableBytes(func(data []byte) { copy(data, sv.Data) }); err != nil {
			return nil, nil, fmt.Errorf("variable %q: %w", sv.Name, err)
		}
		values[v] = t
	}
	for _, v := range checkpointedVariables(m) {
		if _, ok := values[v]; !ok {
			return nil, nil, fmt.Errorf("the checkpoint has no variable %q, which this run has", v.ParameterName())
		}
	}
	return values, rng, nil
}

// checkpointedVariables are the model's variables whose values a checkpoint holds once, rank 0's: the
// replicated ones, and buffers kept per process (NoBufferSync), which every process resumes with rank 0's.
func checkpointedVariables(m *prepare.Model) []*context.Variable {
	vars := m.ReplicatedVariables()
	for _, v := range m.Buffers() {
		if !slices.Contains(vars, v) {
			vars = append(vars, v)
		}
	}
	return vars
}

// savedRNGState reads the generator state GoMLX's checkpoints package saved with the variables.
func savedRNGState(sv savedVariable) ([]uint64, error) {
	got := shapes.Make(sv.DType, sv.Dims...)
	if sv.DType != dtypes.Uint64 || uintptr(len(sv.Data)) != got.Memory() {
		return nil, fmt.Errorf("variable %q is %s of %d bytes in the checkpoint, not a random number generator "+
			"state", sv.Name, got, len(sv.Data))
	}
	state := make([]uint64, len(sv.Data)/8)
	for i := range state {
		state[i] = binary.LittleEndian.Uint64(sv.Data[8*i:])
	}
	if err := prepare.CheckRNGState(state); err != nil {
		return nil, fmt.Errorf("variable %q: %w", sv.Name, err)
	}
	return state, nil
}

// rngStateFor is the random number generator state this rank takes for model m from a checkpoint: saved
// holds every saving rank's (see savedModel.RNGStates) and rank0 the one among the variables, all that
// checkpoints of earlier versions hold. Rank r takes saved rank r's state, or, where the saving run had no
// rank r, one derived from saved rank 0's and r (prepare.RankRNGState). nil leaves the model's own: the
// model draws no random numbers, or the checkpoint holds no state.
func (a *Accelerator) rngStateFor(m *prepare.Model, saved [][]uint64, rank0 []uint64) ([]uint64, error) {
	if m.RNGVariable() == nil {
		return nil, nil
	}
	if len(saved) == 0 && rank0 != nil {
		saved = [][]uint64{rank0}
	}
	if len(saved) == 0 {
		return nil, nil
	}
	state, err := prepare.RankRNGState(saved, a.Rank())
	if err != nil {
		return nil, fmt.Errorf("random number generator state: %w", err)
	}
	return state, nil
}

// applyLoad sets a validated checkpoint.
func (a *Accelerator) applyLoad(plan *loadPlan) error {
	s := plan.state
	for i, m := range a.models {
		for v, t := range plan.values[i] {
			if err := v.SetValue(t); err != nil {
				return fmt.Errorf("accel: loading state: setting variable %q: %w", v.ScopeAndName(), err)
			}
		}
		if plan.rng[i] != nil {
			if err := m.SetRNGState(plan.rng[i]); err != nil {
				return fmt.Errorf("accel: loading state: model %d: %w", i, err)
			}
		}
		if err := m.Reducer().Restore(plan.accums[i]); err != nil {
			return fmt.Errorf("accel: loading state: model %d: %w", i, err)
		}
	}
	for i, o := range a.optimizers {
		so := s.Optimizers[i]
		if err := o.Restore(prepare.OptimizerState{Steps: so.Steps, Skipped: so.Skipped, Kind: so.Kind}); err != nil {
			return fmt.Errorf("accel: loading state: optimizer %d: %w", i, err)
		}
		if err := o.RestoreLocalSGD(plan.local[i]); err != nil {
			return fmt.Errorf("accel: loading state: optimizer %d: %w", i, err)
		}
	}
	for i, l := range a.checkpointedLoaders() {
		if err := l.Restore(plan.loaders[i]); err != nil {
			return fmt.Errorf("accel: loading state: %w", err)
		}
	}
	return a.state.Restore(plan.gradient)
}

// globalBatch spells out N·K·b: "2 processes × K=4 × batch 16".
func globalBatch(processes, k, batch int) string {
	unit := "processes"
	if processes == 1 {
		unit = "process"
	}
	return fmt.Sprintf("%d %s × K=%d × batch %d", processes, unit, k, batch)
}

// planLocalSGD checks a checkpoint's local SGD state against this run and plans what this rank takes.
//
// Between two averages the processes' parameters differ: such a checkpoint resumes only on the same number
// of processes with the same mode and period, each process taking its own variables back, and is refused
// elsewhere (prepare.ErrInsidePeriod). Right after an average (and for a checkpoint of synchronous
// training) the parameters are the same everywhere and any run takes them; the optimizer state, which
// local SGD leaves each process's own, is each process's own again on the same number of processes under
// local SGD, and process 0's otherwise (what a fresh run's processes start from). DiLoCo's outer
// parameters and momentum are identical on every process and resume on any number of them.
func (a *Accelerator) planLocalSGD(plan *loadPlan, p checkpointPayload) error {
	s, cur := plan.state, a.rt.LocalSGD
	saved := "synchronous training"
	if sl := s.LocalSGD; sl != nil {
		mode := prepare.LocalSGD{Steps: sl.Steps}
		if sl.DiLoCo {
			mode.Outer = &prepare.OuterSGD{LearningRate: sl.OuterLR, Momentum: sl.OuterMomentum}
		}
		saved = mode.String()
	}
	sameMode := cur != nil && s.LocalSGD != nil && cur.Steps == s.LocalSGD.Steps && (cur.Outer != nil) == s.LocalSGD.DiLoCo
	if len(p.Outer) != 0 && len(p.Outer) != len(a.optimizers) {
		return fmt.Errorf("holds DiLoCo state for %d optimizer(s), this run prepared %d", len(p.Outer), len(a.optimizers))
	}
	for i, o := range a.optimizers {
		so := s.Optimizers[i]
		if so.LocalSteps != 0 && (!sameMode || s.WorldSize != a.WorldSize()) {
			return fmt.Errorf("%w (%s, %d optimizer steps after the last average, on %d processes); this run uses "+
				"%s on %d: the processes' parameters differ until the next average, and resume only on the same "+
				"number of processes with the same mode and period; save right after an average "+
				"(optimizer.LocalStepsSinceAverage() == 0) to resume elsewhere", prepare.ErrInsidePeriod, saved,
				so.LocalSteps, s.WorldSize, cur.String(), a.WorldSize())
		}
		state := prepare.LocalSGDState{Since: so.LocalSteps}
		if cur != nil && cur.Outer != nil && len(p.Outer) > i && p.Outer[i] != nil {
			if err := gob.NewDecoder(bytes.NewReader(p.Outer[i])).Decode(&state); err != nil {
				return fmt.Errorf("optimizer %d's DiLoCo state: %w", i, err)
			}
			state.Since = so.LocalSteps
		}
		if err := o.CheckLocalSGD(state); err != nil {
			return fmt.Errorf("optimizer %d: %w", i, err)
		}
		plan.local = append(plan.local, state)
	}
	if cur == nil || s.WorldSize != a.WorldSize() {
		if s.LocalSGD != nil && len(a.optimizers) > 0 {
			plan.notes = append(plan.notes, fmt.Sprintf("the checkpoint holds each process's optimizer state (%s); "+
				"every process of this run takes process 0's", saved))
		}
		return nil
	}
	for i, m := range a.models {
		blob := p.Models[i].Local
		if blob == nil {
			continue
		}
		var all [][]byte
		if err := gob.NewDecoder(bytes.NewReader(blob)).Decode(&all); err != nil {
			return fmt.Errorf("model %d: every process's variables: %w", i, err)
		}
		if len(all) != a.WorldSize() {
			return fmt.Errorf("model %d: the checkpoint holds the variables of %d processes, saved by %d", i, len(all),
				s.WorldSize)
		}
		var mine []savedVariable
		if err := gob.NewDecoder(bytes.NewReader(all[a.Rank()])).Decode(&mine); err != nil {
			return fmt.Errorf("model %d: process %d's variables: %w", i, a.Rank(), err)
		}
		values, _, err := matchVariables(m, mine)
		if err != nil {
			return fmt.Errorf("model %d (process %d's variables): %w", i, a.Rank(), err)
		}
		maps.Copy(plan.values[i], values)
	}
	return nil
}
