package accel

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/checkpoints"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/prepare"
	"github.com/goaccel/goaccel/userstate"
)

// stateFormat versions the layout of state.json. Format 2 records each loader's place as the examples of
// the epoch's order the job consumed (any world size resumes it) and the registered values; format 1
// recorded per-process batch positions, and is still read on the world size that wrote it.
const stateFormat = 2

const (
	stateFile        = "state.json"
	accumulatorsFile = "accumulators.bin"
	// localFile holds every process's variables under local SGD, which part between averages.
	localFile = "local.bin"
	// userStateDir holds the values registered with RegisterForCheckpointing, one file per value (and rank).
	userStateDir = "user"
)

// savedState is what a checkpoint holds beside the variables.
type savedState struct {
	Format int `json:"format"`
	// The accumulation cycle's part (world_size, accumulation_steps, sync_each_batch, gradient) is
	// package accumulate's schema, as is each model's "accumulating".
	accumulate.SavedCycle
	BucketCapMB float64          `json:"bucket_cap_mb"`
	Seed        uint64           `json:"seed"`
	Backend     string           `json:"backend"`
	Models      []savedModel     `json:"models"`
	Optimizers  []savedOptimizer `json:"optimizers"`
	Loaders     []savedLoader    `json:"loaders"`
	// LogRecords is the number of records logged with Log before the checkpoint.
	LogRecords int64 `json:"log_records,omitempty"`
	// UserValues are the values registered with RegisterForCheckpointing (format 2).
	UserValues []savedUserValue `json:"user_values,omitempty"`
	// LocalSGD is the run's local SGD or DiLoCo configuration (absent for synchronous training).
	LocalSGD *savedLocalSGD `json:"local_sgd,omitempty"`
}

// savedLocalSGD records local SGD's configuration; where each optimizer is in its period is in
// savedOptimizer, and every process's variables in each model's localFile.
type savedLocalSGD struct {
	Steps         int     `json:"steps"`
	DiLoCo        bool    `json:"diloco,omitempty"`
	OuterLR       float64 `json:"outer_lr,omitempty"`
	OuterMomentum float64 `json:"outer_momentum,omitempty"`
}

// savedUserValue names a registered value's files: one for a value saved once, one per rank otherwise.
type savedUserValue struct {
	Name    string   `json:"name"`
	PerRank bool     `json:"per_rank,omitempty"`
	Files   []string `json:"files"`
}

type savedModel struct {
	Dir  string   `json:"dir"`
	Plan []string `json:"plan"`
	// Whether the accumulators (accumulators.bin, every rank's) hold a partial cycle.
	accumulate.SavedAccumulators
	// RNGStates are every rank's random number generator state (GoMLX's, which dropout draws from), by
	// rank; absent for a model that draws no random numbers and in checkpoints of earlier versions, whose
	// variables hold only rank 0's (see prepare.RankRNGState for what each rank of a resumed run takes).
	RNGStates [][]uint64 `json:"rng_states,omitempty"`
	// Sharding says how the model's optimizer state was split into per-process blocks (absent when it was
	// replicated: the variables hold it).
	Sharding *savedSharding `json:"sharding,omitempty"`
	// Local names the file of every process's variables under local SGD (localFile; absent otherwise).
	Local string `json:"local,omitempty"`
}

type savedOptimizer struct {
	Model   int   `json:"model"`
	Steps   int64 `json:"steps"`
	Skipped int64 `json:"skipped"`
	// Kind is the GoMLX optimizer's Go type (absent in older checkpoints).
	Kind string `json:"kind,omitempty"`
	// LocalSteps are local SGD's optimizer steps since the last average; Outer names the file of DiLoCo's
	// outer parameters and momentum.
	LocalSteps int    `json:"local_steps,omitempty"`
	Outer      string `json:"outer,omitempty"`
}

type savedLoader struct {
	Epoch int `json:"epoch"`
	// Consumed is the number of examples (for a stream, batches) of the epoch's global order the job
	// consumed (format 2; see prepare.LoaderState).
	Consumed int `json:"consumed"`
	// Position is format 1's place: batches per process.
	Position int `json:"position,omitempty"`
	// BatchSize is the per-process batch size. Examples (format 2) is the source's length (-1 for a
	// stream); Batches (format 1) the batches per process and epoch (-1 for a stream). Both are absent in
	// older checkpoints.
	BatchSize int `json:"batch_size,omitempty"`
	Examples  int `json:"examples,omitempty"`
	Batches   int `json:"batches,omitempty"`
}

// WithCheckpointDir names the directory the job will SaveState into, so that New checks it when the job
// starts rather than when it first saves: the main process creates it, checks that it can write there, and
// takes it for the job's life (see checkpoint.Acquire), so a second job given the same directory is refused
// at once, naming the job that holds it. Every rank's New returns the main process's error. SaveState into
// another directory takes that one at its first save.
func WithCheckpointDir(dir string) Option { return func(c *config) { c.checkpointDir = dir } }

// holdCheckpointDir takes dir for this job on the main process (once per directory) and tells every rank
// the outcome, so all ranks fail alike. Collective.
func (a *Accelerator) holdCheckpointDir(dir string) error {
	var lockErr error
	if a.IsMainProcess() {
		if _, held := a.checkpointLocks[dir]; !held {
			lock, err := checkpoint.Acquire(dir)
			if err == nil {
				if a.checkpointLocks == nil {
					a.checkpointLocks = map[string]*checkpoint.Lock{}
				}
				a.checkpointLocks[dir] = lock
			}
			lockErr = err
		}
	}
	if a.WorldSize() == 1 {
		return lockErr
	}
	status, err := broadcastBytes(a.comm, []byte(errorText(lockErr)))
	if err != nil {
		return fmt.Errorf("accel: checkpoint directory: %w", err)
	}
	if msg, _ := splitStatus(status); msg != "" {
		if lockErr != nil {
			return lockErr
		}
		return fmt.Errorf("accel: checkpoint directory (main process): %s", msg)
	}
	return nil
}

// releaseCheckpointDirs gives back every directory this job holds.
func (a *Accelerator) releaseCheckpointDirs() error {
	var errs []error
	for dir, lock := range a.checkpointLocks {
		errs = append(errs, lock.Release())
		delete(a.checkpointLocks, dir)
	}
	return errors.Join(errs...)
}

// WithCheckpointLimit keeps only the newest n checkpoints in a SaveState directory (default, and 0: keep
// all). A negative n is refused by New.
func WithCheckpointLimit(n int) Option { return func(c *config) { c.checkpointLimit = n } }

// SaveState writes a checkpoint of everything needed to resume exactly: model variables and optimizer
// state (through GoMLX's checkpoints package), the optimizer step counts, the position inside the
// accumulation cycle with every rank's partial gradients, every rank's random number generator state (what
// dropout draws from), each data loader's epoch and
// place in it (the examples of the epoch's order the job consumed; after the epoch's last batch, the next
// epoch's start), the values registered with RegisterForCheckpointing, and the run's configuration. It
// creates dir/checkpoint-NNNNNNNN atomically (see package checkpoint) and returns its path.
//
// Collective: every rank calls it; only the main process writes, and every rank returns once the
// checkpoint is durable, or with the main process's error. Under a sharding strategy every process also
// writes its own blocks of the optimizer state, in parallel, into the checkpoint being written, which must
// then be on a filesystem every process sees (docs/sharding.md); if one of them fails, the save fails on
// every process and no checkpoint appears.
func (a *Accelerator) SaveState(dir string) (string, error) {
	defer a.timeline.span("save checkpoint", a.timeline.now())
	if err := a.checkOpen(); err != nil {
		return "", err
	}
	state, reducers, err := a.currentState()
	if err != nil {
		return "", err
	}
	// Every rank's partial sums travel to the main process; at a sync boundary they are zero but still
	// small next to the model, so the layout stays the same whatever the position.
	accumulators := make([][]byte, len(a.models))
	for i, m := range a.models {
		if accumulators[i], err = m.Reducer().GatherState(reducers[i]); err != nil {
			return "", fmt.Errorf("accel: saving state: %w", err)
		}
		if state.Models[i].RNGStates, err = a.gatherRNGStates(m); err != nil {
			return "", fmt.Errorf("accel: saving state: model %d: %w", i, err)
		}
	}
	local, err := a.gatherLocalVariables(&state)
	if err != nil {
		return "", fmt.Errorf("accel: saving state: %w", err)
	}
	user, err := a.userState.Collect(a.comm)
	if err != nil {
		return "", fmt.Errorf("accel: saving state: %w", err)
	}
	// No other job may write here while this one does (it would delete this job's temporary checkpoint).
	if err := a.holdCheckpointDir(dir); err != nil {
		return "", err
	}
	blocks, sharded, err := a.blockStates()
	if err != nil {
		return "", err
	}
	var path string
	var saveErr error
	if a.IsMainProcess() {
		shared := false
		path, saveErr = checkpoint.Write(dir, a.cfg.checkpointLimit, func(tmp string) error {
			if !sharded {
				return a.writeState(tmp, state, accumulators, local, user)
			}
			// Every process writes its blocks into tmp while this one writes the rest; tmp becomes the
			// checkpoint only if all of them succeed.
			shared = true
			return a.shareCheckpointDir(tmp, state, blocks, func() error {
				return a.writeState(tmp, state, accumulators, local, user)
			})
		})
		if sharded && !shared {
			// The save failed before there was a directory: the other processes still wait to hear of one.
			_ = a.shareCheckpointDir("", state, blocks, nil)
		}
	} else if sharded {
		_ = a.shareCheckpointDir("", state, blocks, nil) // the main process's status below says how it went
	}
	// The broadcast doubles as the barrier: no rank returns before the checkpoint is durable.
	status, err := broadcastBytes(a.comm, []byte(errorText(saveErr)+"\x00"+path))
	if err != nil {
		return "", fmt.Errorf("accel: saving state: %w", err)
	}
	msg, path := splitStatus(status)
	if msg != "" {
		return "", fmt.Errorf("accel: saving state (main process): %s", msg)
	}
	return path, nil
}

// currentState is what state.json will hold, and each model's reducer state (this rank's accumulators).
func (a *Accelerator) currentState() (savedState, []accumulate.ReducerState, error) {
	s := savedState{Format: stateFormat, SavedCycle: accumulate.SavedCycle{WorldSize: a.WorldSize(),
		Steps: a.state.Steps(), SyncEachBatch: a.state.SyncEachBatch(), Position: a.state.Position()},
		BucketCapMB: a.cfg.bucketCapMB, Seed: a.cfg.seed, Backend: a.compute.Name()}
	if a.IsMainProcess() {
		s.LogRecords = a.logRecords
	}
	var reducers []accumulate.ReducerState
	for i, m := range a.models {
		if !m.Materialized() {
			return s, nil, fmt.Errorf("accel: saving state: model %d has no weights yet (run a step first)", i)
		}
		rs, err := m.Reducer().State()
		if errors.Is(err, accumulate.ErrSyncedNotApplied) {
			return s, nil, fmt.Errorf("accel: saving state: model %d has synced gradients that were not applied; "+
				"save after the optimizer's Step", i)
		}
		if err != nil {
			return s, nil, fmt.Errorf("accel: saving state: model %d: %w", i, err)
		}
		reducers = append(reducers, rs)
		s.Models = append(s.Models, savedModel{Dir: fmt.Sprintf("model-%d", i), Plan: m.Plan().Signature(),
			SavedAccumulators: rs.SavedAccumulators, Sharding: a.savedShardingOf(m)})
	}
	for _, o := range a.optimizers {
		idx := -1
		for i, m := range a.models {
			if m == o.Model() {
				idx = i
			}
		}
		os := o.State()
		s.Optimizers = append(s.Optimizers, savedOptimizer{Model: idx, Steps: os.Steps, Skipped: os.Skipped,
			Kind: os.Kind, LocalSteps: o.LocalStepsSinceAverage()})
	}
	if l := a.rt.LocalSGD; l != nil {
		s.LocalSGD = &savedLocalSGD{Steps: l.Steps}
		if l.Outer != nil {
			s.LocalSGD.DiLoCo, s.LocalSGD.OuterLR, s.LocalSGD.OuterMomentum = true, l.Outer.LearningRate, l.Outer.Momentum
		}
		for i := range s.Models {
			s.Models[i].Local = localFile
		}
	}
	for _, l := range a.checkpointedLoaders() {
		ls := l.State()
		s.Loaders = append(s.Loaders, savedLoader{Epoch: ls.Epoch, Consumed: ls.Consumed, BatchSize: l.BatchSize(),
			Examples: l.SourceLen()})
	}
	return s, reducers, nil
}

// gatherRNGStates gives every rank each rank's random number generator state for model m, nil when the
// model has none. Every rank returns the same result: a rank that cannot read its state sends none, and
// every rank then refuses the gathered states alike. Collective.
func (a *Accelerator) gatherRNGStates(m *prepare.Model) ([][]uint64, error) {
	state, localErr := m.RNGState()
	data := make([]byte, 0, 8*len(state))
	for _, w := range state {
		data = binary.LittleEndian.AppendUint64(data, w)
	}
	all, err := replicas.AllGatherBytes(a.comm, data)
	if err != nil {
		return nil, err
	}
	if localErr != nil {
		return nil, localErr
	}
	states := make([][]uint64, len(all))
	missing := 0
	for r, data := range all {
		if len(data) == 0 {
			missing++
			continue
		}
		states[r] = make([]uint64, len(data)/8)
		for i := range states[r] {
			states[r][i] = binary.LittleEndian.Uint64(data[8*i:])
		}
		if len(data)%8 != 0 {
			return nil, fmt.Errorf("rank %d's random number generator state is %d bytes", r, len(data))
		}
		if err := prepare.CheckRNGState(states[r]); err != nil {
			return nil, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	switch missing {
	case 0:
		return states, nil
	case len(all):
		return nil, nil
	}
	for r, data := range all {
		if len(data) == 0 {
			return nil, fmt.Errorf("rank %d has no random number generator state, rank %d has one", r,
				slices.IndexFunc(all, func(d []byte) bool { return len(d) > 0 }))
		}
	}
	return nil, nil
}

// checkpointedLoaders are the prepared loaders whose positions checkpoints hold, in order.
func (a *Accelerator) checkpointedLoaders() []*prepare.DataLoader {
	var loaders []*prepare.DataLoader
	for _, l := range a.loaders {
		if l.Checkpointed() {
			loaders = append(loaders, l)
		}
	}
	return loaders
}

// writeState fills a checkpoint directory (main process only).
func (a *Accelerator) writeState(dir string, state savedState, accumulators [][]byte, local localFiles,
	user userstate.Saved) error {
	for i, m := range a.models {
		modelDir := filepath.Join(dir, state.Models[i].Dir)
		// The accumulators are every rank's (accumulators.bin), the blocks each rank's own (blocksDir).
		exclude := append(slices.Clone(m.Reducer().Accumulators()), a.layout(m).BlockVariables()...)
		if err := saveVariables(m.Context(), modelDir, exclude); err != nil {
			return err
		}
		if err := checkpoint.WriteFile(filepath.Join(modelDir, accumulatorsFile), accumulators[i]); err != nil {
			return err
		}
		if name := state.Models[i].Local; name != "" {
			if err := checkpoint.WriteFile(filepath.Join(modelDir, name), local.models[i]); err != nil {
				return err
			}
		}
	}
	for i, so := range state.Optimizers {
		if so.Outer != "" {
			if err := checkpoint.WriteFile(filepath.Join(dir, so.Outer), local.outer[i]); err != nil {
				return err
			}
		}
	}
	if len(user.Values) > 0 {
		if err := os.Mkdir(filepath.Join(dir, userStateDir), 0o755); err != nil {
			return err
		}
	}
	// Files are numbered, not named after the values: a name is any string, a file name is not.
	for i, v := range user.Values {
		sv := savedUserValue{Name: v.Name, PerRank: v.PerRank}
		for rank, data := range v.Data {
			file := fmt.Sprintf("%s/%03d.bin", userStateDir, i)
			if v.PerRank {
				file = fmt.Sprintf("%s/%03d-rank-%d.bin", userStateDir, i, rank)
			}
			if err := checkpoint.WriteFile(filepath.Join(dir, filepath.FromSlash(file)), data); err != nil {
				return err
			}
			sv.Files = append(sv.Files, file)
		}
		state.UserValues = append(state.UserValues, sv)
	}
	data, err := json.MarshalIndent(state, "", "  ")
	if err != nil {
		return err
	}
	return checkpoint.WriteFile(filepath.Join(dir, stateFile), data)
}

// saveVariables writes ctx's variables, but the per-rank accumulators, with GoMLX's checkpoints package.
func saveVariables(ctx *context.Context, dir string, exclude []*context.Variable) (err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	previous := ctx.Loader()
	defer ctx.SetLoader(previous) // the handler registers itself as the context's loader; undo that
	defer recoverInto(&err, "saving variables")
	h, err := checkpoints.Build(ctx).Dir(dir).ExcludeAllParams().Done()
	if err != nil {
		return err
	}
	h.ExcludeVarsFromSaving(exclude...)
	return h.Save()
}

func recoverInto(err *error, what string) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("accel: %s: %v", what, r)
	}
}

// broadcastBytes sends root's (rank 0's) data of any length to every rank.
func broadcastBytes(comm *backends.Communicator, data []byte) ([]byte, error) {
	length := []int64{int64(len(data))}
	if err := comm.Broadcast(backends.BufferOf(length), 0); err != nil {
		return nil, err
	}
	if comm.Rank() != 0 {
		data = make([]byte, length[0])
	}
	if length[0] == 0 {
		return data, nil
	}
	err := comm.Broadcast(backends.BufferOf(data), 0)
	return data, err
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func splitStatus(status []byte) (msg, path string) {
	for i, c := range status {
		if c == 0 {
			return string(status[:i]), string(status[i+1:])
		}
	}
	return string(status), ""
}

// localFiles are local SGD's files of a checkpoint (main process): each model's localFile, and each
// optimizer's DiLoCo state (nil where there is none).
type localFiles struct {
	models, outer [][]byte
}

// gatherLocalVariables gathers, under local SGD, every process's values of each model's checkpointed
// variables — the parameters and the optimizer state part between averages, and the optimizer state stays
// each process's own even right after one — and each optimizer's DiLoCo state (identical on every
// process: the main process's). It names the optimizers' files in state. Collective.
func (a *Accelerator) gatherLocalVariables(state *savedState) (localFiles, error) {
	var files localFiles
	if a.rt.LocalSGD == nil {
		return files, nil
	}
	for i, m := range a.models {
		var mine []savedVariable
		for _, v := range checkpointedVariables(m) {
			t, err := v.Value()
			if err != nil {
				return files, fmt.Errorf("model %d: variable %q: %w", i, v.ScopeAndName(), err)
			}
			sv := savedVariable{Name: v.ParameterName(), DType: t.DType(), Dims: slices.Clone(t.Shape().Dimensions)}
			if err := t.ConstBytes(func(data []byte) { sv.Data = slices.Clone(data) }); err != nil {
				return files, fmt.Errorf("model %d: variable %q: %w", i, v.ScopeAndName(), err)
			}
			mine = append(mine, sv)
		}
		var buf bytes.Buffer
		if err := gob.NewEncoder(&buf).Encode(mine); err != nil {
			return files, err
		}
		all, err := replicas.AllGatherBytes(a.comm, buf.Bytes())
		if err != nil {
			return files, fmt.Errorf("model %d: gathering every process's variables: %w", i, err)
		}
		buf.Reset()
		if err := gob.NewEncoder(&buf).Encode(all); err != nil {
			return files, err
		}
		files.models = append(files.models, buf.Bytes())
	}
	for i, o := range a.optimizers {
		ls := o.LocalSGDState()
		var data []byte
		if ls.Outer != nil {
			var buf bytes.Buffer
			if err := gob.NewEncoder(&buf).Encode(ls); err != nil {
				return files, err
			}
			data = buf.Bytes()
			state.Optimizers[i].Outer = fmt.Sprintf("diloco-%d.bin", i)
		}
		files.outer = append(files.outer, data)
	}
	return files, nil
}
