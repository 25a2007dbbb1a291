package accel_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/checkpoint"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// The checkpoint the load tests start from: Adam, K=2, batch 2 per rank, seed 7, saved mid-cycle.
const (
	loadK, loadBatch, loadSeed, loadExamplesPerRank = 2, 2, 7, 10
)

// loadSetup describes one rank's run that tries to load the checkpoint.
type loadSetup struct {
	kind  testmodel.OptimizerKind
	batch int
	seed  uint64
}

var savedSetup = loadSetup{kind: testmodel.Adam, batch: loadBatch, seed: loadSeed}

// prepareForLoad prepares a run as described, builds its model and returns it.
func prepareForLoad(acc *accel.Accelerator, s loadSetup) (resumable, error) {
	model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
	if err != nil {
		return resumable{}, err
	}
	opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(s.kind))
	if err != nil {
		return resumable{}, err
	}
	x, y := testmodel.Data(acc.WorldSize()*loadExamplesPerRank, 1)
	src, err := prepare.TensorSource([]*tensors.Tensor{x}, []*tensors.Tensor{y})
	if err != nil {
		return resumable{}, err
	}
	loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(s.batch), prepare.Shuffle())
	if err != nil {
		return resumable{}, err
	}
	return resumable{model, opt, loader}, nil
}

// runState is everything LoadState may change on a rank.
type runState struct {
	Variables string `json:"variables"` // digest of every variable, accumulators included
	Steps     int64  `json:"steps"`
	Epoch     int    `json:"epoch"`
	Position  int    `json:"position"`
}

func stateOf(r resumable) (runState, error) {
	d, err := replicas.VariablesDigest(allVariables(r.model.Context()))
	return runState{Variables: hex.EncodeToString(d[:]), Steps: r.opt.Steps(), Epoch: r.loader.Epoch(),
		Position: r.loader.Position()}, err
}

// saveForLoad trains a few micro-batches with savedSetup (stopping mid-cycle) and saves a checkpoint.
func saveForLoad(acc *accel.Accelerator, dir string) error {
	r, err := prepareForLoad(acc, savedSetup)
	if err != nil {
		return err
	}
	if _, err := r.train(acc, 1, 3); err != nil {
		return err
	}
	_, err = acc.SaveState(dir)
	return err
}

// reshapeSavedVariable swaps the dimensions of the first non-square matrix in the GoMLX checkpoint of
// model 0 (the bytes stay the same size) and recomputes the manifest's checksum, as someone editing a
// checkpoint by hand would: the files are intact, the shape is not the model's.
func reshapeSavedVariable(t *testing.T, ckpt string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(ckpt, "model-0", "*.json"))
	require.NoError(t, err)
	require.Len(t, files, 1)
	data, err := os.ReadFile(files[0])
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(data, &doc))
	name := ""
	for _, v := range doc["Variables"].([]any) {
		v := v.(map[string]any)
		dims, _ := v["Dimensions"].([]any)
		if len(dims) == 2 && dims[0] != dims[1] {
			dims[0], dims[1] = dims[1], dims[0]
			name = v["ParameterName"].(string)
			break
		}
	}
	require.NotEmpty(t, name, "no matrix to reshape")
	data, err = json.Marshal(doc)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(files[0], data, 0o644))

	manifestPath := filepath.Join(ckpt, checkpoint.ManifestFile)
	raw, err := os.ReadFile(manifestPath)
	require.NoError(t, err)
	var m checkpoint.Manifest
	require.NoError(t, json.Unmarshal(raw, &m))
	rel, err := filepath.Rel(ckpt, files[0])
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	m.Files[filepath.ToSlash(rel)] = hex.EncodeToString(sum[:])
	raw, err = json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(manifestPath, raw, 0o644))
	_, err = checkpoint.Verify(ckpt)
	require.NoError(t, err, "the edited checkpoint must pass its checksums")
	return name
}

// TestFailedLoadStateChangesNothing: a checkpoint that does not fit is refused on every rank before any
// rank changes anything — weights, optimizer state, accumulators, step counts and loader positions stay as
// they were — with an error naming what differs (and, when only some ranks refuse, which ones).
func TestFailedLoadStateChangesNothing(t *testing.T) {
	for _, ranks := range []int{1, 2} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			opts := []accel.Option{accel.WithGradientAccumulationSteps(loadK), accel.WithSeed(loadSeed)}
			dir := t.TempDir()
			runRanks(t, ranks, opts, func(_ int, acc *accel.Accelerator) error { return saveForLoad(acc, dir) })
			latest, err := checkpoint.Latest(dir)
			require.NoError(t, err)
			reshaped := filepath.Join(t.TempDir(), "reshaped")
			require.NoError(t, os.CopyFS(reshaped, os.DirFS(latest)))
			variable := reshapeSavedVariable(t, reshaped)

			for _, tc := range []struct {
				name  string
				dir   string
				setup func(rank int) (loadSetup, []accel.Option)
				want  []string
			}{
				{"batch size", dir, func(int) (loadSetup, []accel.Option) {
					s := savedSetup
					s.batch = 1
					return s, opts
				}, []string{"saved with batch size 2 per process, this run uses 1"}},
				{"optimizer type", dir, func(int) (loadSetup, []accel.Option) {
					s := savedSetup
					s.kind = testmodel.SGD
					return s, opts
				}, []string{"cannot be loaded into another optimizer", "*optimizers.adam"}},
				{"seed", dir, func(int) (loadSetup, []accel.Option) {
					return savedSetup, []accel.Option{accel.WithGradientAccumulationSteps(loadK), accel.WithSeed(8)}
				}, []string{"saved with seed 7, this run uses 8"}},
				{"tensor shape", reshaped, func(int) (loadSetup, []accel.Option) { return savedSetup, opts },
					[]string{variable, "in the checkpoint and"}},
				{"one rank differs", dir, func(rank int) (loadSetup, []accel.Option) {
					s := savedSetup
					if rank == ranks-1 {
						s.batch = 1
					}
					return s, opts
				}, []string{fmt.Sprintf("rank %d: ", ranks-1), "batch size 2 per process, this run uses 1"}},
			} {
				if ranks == 1 && tc.name == "one rank differs" {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					errs := make([]error, ranks)
					before := make([]runState, ranks)
					after := make([]runState, ranks)
					inProcessRanks(t, ranks, func(rank int, comm accel.Option) {
						setup, opts := tc.setup(rank)
						acc, err := accel.New(append([]accel.Option{comm, accel.WithBackend("go")}, opts...)...)
						require.NoError(t, err)
						defer acc.Close()
						r, err := prepareForLoad(acc, setup)
						require.NoError(t, err)
						x, y := testmodel.Data(setup.batch, 3)
						require.NoError(t, r.model.Materialize(batchOf(x, y)))
						before[rank], err = stateOf(r)
						require.NoError(t, err)
						errs[rank] = acc.LoadState(tc.dir)
						after[rank], err = stateOf(r)
						require.NoError(t, err)
					})
					for rank, err := range errs {
						require.Error(t, err, "rank %d", rank)
						for _, want := range tc.want {
							assert.Contains(t, err.Error(), want, "rank %d", rank)
						}
						assert.Contains(t, err.Error(), "nothing was changed", "rank %d", rank)
					}
					assert.Equal(t, before, after, "a refused checkpoint must change nothing")
				})
			}
		})
	}
}

// inProcessRanks runs fn on each rank of an in-process group, in its own goroutine; comm is the option
// that puts an accelerator on the rank's communicator. The timeout turns a rank that fails before a
// collective into errors on the others rather than a hung test.
func inProcessRanks(t *testing.T, ranks int, fn func(rank int, comm accel.Option)) {
	t.Helper()
	comms, err := backends.NewInProcessGroup(ranks, backends.WithTimeout(30*time.Second))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() { fn(r, accel.WithCommunicator(comms[r])) })
	}
	wg.Wait()
}

// TestLoadStateFallsBackToIntactCheckpoint: when the newest checkpoint is incomplete, loading the directory
// loads the newest intact one and says so.
func TestLoadStateFallsBackToIntactCheckpoint(t *testing.T) {
	dir := t.TempDir()
	opts := []accel.Option{accel.WithGradientAccumulationSteps(loadK), accel.WithSeed(loadSeed)}
	var savedSteps int64
	var savedState runState
	runRanks(t, 1, opts, func(_ int, acc *accel.Accelerator) error {
		r, err := prepareForLoad(acc, savedSetup)
		if err != nil {
			return err
		}
		if _, err := r.train(acc, 1, 4); err != nil {
			return err
		}
		if _, err := acc.SaveState(dir); err != nil {
			return err
		}
		savedSteps = r.opt.Steps()
		if savedState, err = stateOf(r); err != nil {
			return err
		}
		if _, err := r.train(acc, 1, 0); err != nil {
			return err
		}
		_, err = acc.SaveState(dir)
		return err
	})
	all, err := checkpoint.List(dir)
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.NoError(t, os.Remove(filepath.Join(all[1], checkpoint.ManifestFile)))

	var out bytes.Buffer
	runRanks(t, 1, append(opts, accel.WithOutput(&out)), func(_ int, acc *accel.Accelerator) error {
		r, err := prepareForLoad(acc, savedSetup)
		if err != nil {
			return err
		}
		if err := acc.LoadState(dir); err != nil {
			return err
		}
		assert.Equal(t, savedSteps, r.opt.Steps())
		loaded, err := stateOf(r)
		assert.Equal(t, savedState.Position, loaded.Position)
		return err
	})
	assert.Contains(t, out.String(), "is incomplete")
	assert.Contains(t, out.String(), "loading the newest intact checkpoint, "+all[0])
}

// TestMPILoadStateRefusalChangesNothing: under mpirun with 2 and 4 ranks, an Adam checkpoint loaded into an
// SGD run, or into a run where only the last rank has another batch size, is refused on every rank, and
// every rank keeps exactly its state: no rank loads weights the others refused.
func TestMPILoadStateRefusalChangesNothing(t *testing.T) {
	cases := map[string]func(rank, size int) loadSetup{
		"optimizer type": func(int, int) loadSetup {
			s := savedSetup
			s.kind = testmodel.SGD
			return s
		},
		"last rank's batch size": func(rank, size int) loadSetup {
			s := savedSetup
			if rank == size-1 {
				s.batch = 1
			}
			return s
		},
	}
	type outcome struct {
		Err     string   `json:"err"`
		Before  runState `json:"before"`
		After   runState `json:"after"`
		Trained bool     `json:"trained"`
	}
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(func(_ *backends.Communicator) (any, error) {
			opts := []accel.Option{accel.WithBackend("go"), accel.WithGradientAccumulationSteps(loadK),
				accel.WithSeed(loadSeed)}
			dir := os.Getenv("GOACCEL_TEST_CHECKPOINTS")
			acc, err := accel.New(opts...)
			if err != nil {
				return nil, err
			}
			if err := saveForLoad(acc, dir); err != nil {
				return nil, err
			}
			if err := acc.Close(); err != nil {
				return nil, err
			}
			outcomes := map[string]outcome{}
			// Every rank must run the cases in the same order: their collectives match by order.
			for _, name := range slices.Sorted(maps.Keys(cases)) {
				setup := cases[name]
				acc, err := accel.New(opts...)
				if err != nil {
					return nil, err
				}
				r, err := prepareForLoad(acc, setup(acc.Rank(), acc.WorldSize()))
				if err != nil {
					return nil, err
				}
				x, y := testmodel.Data(r.loader.BatchSize(), 3)
				if err := r.model.Materialize(batchOf(x, y)); err != nil {
					return nil, err
				}
				var o outcome
				if o.Before, err = stateOf(r); err != nil {
					return nil, err
				}
				if err := acc.LoadState(dir); err != nil {
					o.Err = err.Error()
				}
				if o.After, err = stateOf(r); err != nil {
					return nil, err
				}
				outcomes[name] = o
				if err := acc.Close(); err != nil {
					return nil, err
				}
			}
			return outcomes, nil
		}))
		return
	}
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			results := mpitest.Run(t, np, t.Name(), mpitest.WithEnv("GOACCEL_TEST_CHECKPOINTS="+t.TempDir()),
				mpitest.WithTimeout(3*time.Minute))
			for rank, res := range results {
				var outcomes map[string]outcome
				require.NoError(t, res.Decode(&outcomes))
				for name := range cases {
					o := outcomes[name]
					assert.Contains(t, o.Err, "nothing was changed", "%s, rank %d", name, rank)
					assert.Equal(t, o.Before, o.After, "%s, rank %d: a refused checkpoint must change nothing", name, rank)
				}
				assert.Contains(t, outcomes["optimizer type"].Err, "every rank: ", "rank %d", rank)
				assert.Contains(t, outcomes["optimizer type"].Err, "cannot be loaded into another optimizer", "rank %d", rank)
				assert.Contains(t, outcomes["last rank's batch size"].Err,
					fmt.Sprintf("rank %d: checkpoint", np-1), "rank %d", rank)
			}
		})
	}
}
