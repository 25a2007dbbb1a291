package accel_test

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/cpu"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/prepare"
)

// The tests in this file run as real MPI jobs: go test re-executes the test binary under mpirun (see
// internal/testing/mpitest), each rank builds its Accelerator from mpirun's environment, and the parent checks
// what the ranks report.

// keepingMPI makes a rank's work for mpitest.Do: it opens a communicator, the keeper, that keeps MPI
// initialised while rank creates and closes several Accelerators in turn (MPI can be initialised only once
// per process), and closes it after rank returns.
func keepingMPI(rank func(keeper *backends.Communicator) (any, error)) func() (any, error) {
	return func() (any, error) {
		topo, err := backends.DetectTopology()
		if err != nil {
			return nil, err
		}
		keeper, err := backends.Open("mpi", topo)
		if err != nil {
			return nil, err
		}
		defer keeper.Close()
		return rank(keeper)
	}
}

type equivalenceReport struct {
	K       int                     `json:"k"`
	Kind    testmodel.OptimizerKind `json:"kind"`
	Steps   int64                   `json:"steps"`
	Initial testmodel.Snapshot      `json:"initial"`
	Final   testmodel.Snapshot      `json:"final"`
}

type mpiReport struct {
	Equivalence []equivalenceReport `json:"equivalence"`
	// Digests are the replica digests after each of the replica run's optimizer steps.
	Digests []string `json:"digests"`
	// AllReducesPerStep counts all-reduce calls per optimizer step; Buckets is the plan's bucket count.
	AllReducesPerStep []int64 `json:"all_reduces_per_step"`
	Buckets           int     `json:"buckets"`
	NoSyncCalls       int64   `json:"no_sync_calls"`
	// Gathered are the example indices GatherForMetrics returned over an uneven dataset, and N its size.
	Gathered []int32 `json:"gathered"`
	N        int     `json:"n"`
}

const (
	mpiBatch = 2
	mpiSteps = 3
)

var mpiCombos = []struct {
	k    int
	kind testmodel.OptimizerKind
}{{1, testmodel.SGD}, {3, testmodel.SGD}, {1, testmodel.Adam}, {3, testmodel.Adam}}

func mpiRank(keeper *backends.Communicator) (any, error) {
	var rep mpiReport
	size := keeper.Size()

	// Equivalence: N ranks × K micro-batches × b against one process on N·K·b, checked by the parent.
	for _, c := range mpiCombos {
		inputs, labels := testmodel.Data(size*c.k*mpiBatch*mpiSteps, 1)
		acc, err := accel.New(accel.WithBackend("go"), accel.WithGradientAccumulationSteps(c.k))
		if err != nil {
			return nil, err
		}
		res, err := testmodel.Run{Kind: c.kind, Inputs: inputs, Labels: labels, BatchSize: mpiBatch}.Train(acc)
		if err != nil {
			return nil, err
		}
		er := equivalenceReport{K: c.k, Kind: c.kind, Steps: res.Steps}
		if er.Initial, err = testmodel.TakeSnapshot(allVariables(res.Initial)); err != nil {
			return nil, err
		}
		if er.Final, err = testmodel.TakeSnapshot(res.Model.Parameters()); err != nil {
			return nil, err
		}
		rep.Equivalence = append(rep.Equivalence, er)
		if err := acc.Close(); err != nil {
			return nil, err
		}
	}

	// Replicas and counters: 100 optimizer steps with K=2, small buckets, the replica check on.
	acc, err := accel.New(accel.WithBackend("go"), accel.WithGradientAccumulationSteps(2),
		accel.WithBucketCapMB(0.0001), accel.WithReplicaCheck())
	if err != nil {
		return nil, err
	}
	inputs, labels := testmodel.Data(size*2*mpiBatch*100, 2)
	var model *prepare.Model
	last := acc.Stats()
	run := testmodel.Run{Kind: testmodel.Adam, Inputs: inputs, Labels: labels, BatchSize: mpiBatch,
		AfterStep: func(int64) error {
			d, err := replicas.VariablesDigest(model.ReplicatedVariables())
			rep.Digests = append(rep.Digests, hex.EncodeToString(d[:]))
			now := acc.Stats()
			rep.AllReducesPerStep = append(rep.AllReducesPerStep,
				now.Collectives.Sub(last.Collectives).Of(backends.OpAllReduce).Calls)
			last = now
			return err
		}}
	if _, err := trainCapturing(acc, run, &model); err != nil {
		return nil, err
	}
	rep.Buckets = len(model.Plan().Buckets)
	before := acc.Stats().Collectives
	x, y := testmodel.Data(mpiBatch, 3)
	err = acc.NoSync(func() error {
		_, err := acc.Backward(model, batchOf(x, y))
		return err
	})
	if err != nil {
		return nil, err
	}
	rep.NoSyncCalls = acc.Stats().Collectives.Sub(before).Calls()

	// Uneven dataset: n not divisible by N nor by N·b.
	rep.N = 4*size + 3
	ux, uy := testmodel.Data(rep.N, 4)
	src, err := prepare.TensorSource([]*tensors.Tensor{ux}, []*tensors.Tensor{uy})
	if err != nil {
		return nil, err
	}
	loader, err := acc.PrepareDataLoader(src, prepare.BatchSize(3), prepare.Shuffle())
	if err != nil {
		return nil, err
	}
	for batch, err := range loader.All() {
		if err != nil {
			return nil, err
		}
		ids := make([]int32, len(batch.Indices))
		for i, idx := range batch.Indices {
			ids[i] = int32(idx)
		}
		all, err := acc.GatherForMetrics(tensors.FromFlatDataAndDimensions(ids, len(ids)), batch)
		if err != nil {
			return nil, err
		}
		rep.Gathered = append(rep.Gathered, tensors.MustCopyFlatData[int32](all)...)
	}
	return rep, acc.Close()
}

func allVariables(ctx *context.Context) []*context.Variable {
	var vars []*context.Variable
	for v := range ctx.IterVariables() {
		vars = append(vars, v)
	}
	return vars
}

// TestMPI runs the multi-process checks (equivalence, bitwise replicas, sync counters) under mpirun with 2 and 4 ranks.
func TestMPI(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(mpiRank))
		return
	}
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			results := mpitest.Run(t, np, "TestMPI", mpitest.WithTimeout(5*time.Minute))
			reports := make([]mpiReport, np)
			for r, res := range results {
				require.NoError(t, res.Decode(&reports[r]))
			}
			backend, err := cpu.New(cpu.Config{Backend: "go"})
			require.NoError(t, err)
			for i, c := range mpiCombos {
				t.Run(fmt.Sprintf("K=%d/%s", c.k, c.kind), func(t *testing.T) {
					first := reports[0].Equivalence[i]
					require.EqualValues(t, mpiSteps, first.Steps)
					inputs, labels := testmodel.Data(np*c.k*mpiBatch*mpiSteps, 1)
					ref := first.Initial.Context()
					require.NoError(t, testmodel.ReferenceTrain(backend, ref, c.kind,
						testmodel.ReferenceBatches(inputs, labels, np*c.k*mpiBatch, 1)))
					for r := range np {
						got := reports[r].Equivalence[i]
						assert.Equal(t, first.Initial, got.Initial, "rank %d started from other weights", r)
						worst, name, err := testmodel.MaxRelativeError(allVariables(got.Final.Context()), ref)
						require.NoError(t, err)
						assert.LessOrEqual(t, worst, 1e-5, "rank %d, variable %s", r, name)
					}
				})
			}
			for r := range np {
				rep := reports[r]
				assert.Len(t, rep.Digests, 100, "rank %d", r)
				assert.Equal(t, reports[0].Digests, rep.Digests, "rank %d's weights differ from rank 0's", r)
				assert.Greater(t, rep.Buckets, 1)
				for step, calls := range rep.AllReducesPerStep {
					assert.EqualValues(t, rep.Buckets, calls, "rank %d step %d", r, step+1)
				}
				assert.Zero(t, rep.NoSyncCalls, "rank %d: NoSync communicated", r)
				got := slices.Clone(rep.Gathered)
				slices.Sort(got)
				want := make([]int32, rep.N)
				for i := range want {
					want[i] = int32(i)
				}
				assert.Equal(t, want, got, "rank %d: GatherForMetrics must see each example once", r)
			}
		})
	}
}

// TestMPIModelMismatch: ranks that build different models get an error naming the variable, on every
// rank, and the job ends instead of hanging.
func TestMPIModelMismatch(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			acc, err := accel.New(accel.WithBackend("go"), accel.WithCollectiveTimeout(time.Minute))
			if err != nil {
				return nil, err
			}
			defer acc.Close()
			modelFn := testmodel.MLP
			if acc.Rank() == 1 {
				modelFn = wideMLP
			}
			model, err := acc.PrepareModel(context.New(), modelFn, testmodel.Loss)
			if err != nil {
				return nil, err
			}
			x, y := testmodel.Data(4, 1)
			_, err = acc.Backward(model, batchOf(x, y))
			return err.Error(), nil // nil err would panic: a mismatch must fail
		})
		return
	}
	out := mpitest.Launch(t, 2, t.Name(), mpitest.WithTimeout(2*time.Minute))
	require.False(t, out.TimedOut, "%s", out)
	for r := range 2 {
		res, ok := out.Result(r)
		require.True(t, ok, "rank %d reported nothing:\n%s", r, out)
		var msg string
		require.NoError(t, res.Decode(&msg), "rank %d: %s", r, res.Err)
		assert.Contains(t, msg, "differ across ranks", "rank %d", r)
		assert.Contains(t, msg, "hidden/dense/weights", "rank %d", r)
	}
	assert.Less(t, out.Elapsed, time.Minute)
}

// TestMPIResumeIsBitwiseExact: on 2 MPI processes, training straight through equals training, saving
// mid-epoch and mid-cycle, and resuming in new processes.
func TestMPIResumeIsBitwiseExact(t *testing.T) {
	const k, b, epochs, perEpoch, stopAfter = 3, 2, 2, 11, 16
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(func(keeper *backends.Communicator) (any, error) {
			dir := os.Getenv("GOACCEL_TEST_CHECKPOINTS")
			n := keeper.Size() * b * perEpoch
			newAcc := func() (*accel.Accelerator, resumable, error) {
				acc, err := accel.New(accel.WithBackend("go"), accel.WithGradientAccumulationSteps(k), accel.WithSeed(3))
				if err != nil {
					return nil, resumable{}, err
				}
				return acc, prepareResumable(t, acc, n, b, 1), nil
			}
			acc, r, err := newAcc()
			if err != nil {
				return nil, err
			}
			defer acc.Close()
			switch os.Getenv("GOACCEL_TEST_PHASE") {
			case "first":
				if _, err := r.train(acc, epochs, stopAfter); err != nil {
					return nil, err
				}
				_, err := acc.SaveState(dir)
				return nil, err
			case "straight":
				if _, err := r.train(acc, epochs, 0); err != nil {
					return nil, err
				}
			case "resume":
				if err := acc.LoadState(dir); err != nil {
					return nil, err
				}
				if _, err := r.train(acc, epochs, 0); err != nil {
					return nil, err
				}
			}
			d, err := replicas.VariablesDigest(r.model.ReplicatedVariables())
			return hex.EncodeToString(d[:]), err
		}))
		return
	}
	dir := t.TempDir()
	digests := map[string][]string{}
	for _, phase := range []string{"straight", "first", "resume"} {
		results := mpitest.Run(t, 2, t.Name(), mpitest.WithEnv("GOACCEL_TEST_PHASE="+phase,
			"GOACCEL_TEST_CHECKPOINTS="+dir), mpitest.WithTimeout(3*time.Minute))
		for _, res := range results {
			if phase != "first" {
				var d string
				require.NoError(t, res.Decode(&d))
				digests[phase] = append(digests[phase], d)
			}
		}
	}
	require.Len(t, digests["straight"], 2)
	assert.Equal(t, digests["straight"][0], digests["straight"][1])
	assert.Equal(t, digests["straight"], digests["resume"])
	entries, err := filepath.Glob(filepath.Join(dir, "checkpoint-*"))
	require.NoError(t, err)
	assert.Len(t, entries, 1)
}

// TestMPIDeadRank: a rank killed during training ends the job: every other rank exits within 30 s, and
// mpirun's message names the rank that failed.
func TestMPIDeadRank(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			acc, err := accel.New(accel.WithBackend("go"))
			if err != nil {
				return nil, err
			}
			defer acc.Close()
			inputs, labels := testmodel.Data(acc.WorldSize()*2*1000, 1)
			run := testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: 2,
				AfterStep: func(step int64) error {
					if step == 5 && acc.Rank() == 1 {
						_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					}
					return nil
				}}
			_, err = run.Train(acc)
			return nil, fmt.Errorf("rank %d finished training although rank 1 died: %v", acc.Rank(), err)
		})
		return
	}
	out := mpitest.Launch(t, 2, t.Name(), mpitest.WithTimeout(2*time.Minute))
	assert.False(t, out.TimedOut, "%s", out)
	assert.NotZero(t, out.ExitCode, "%s", out)
	assert.Less(t, out.Elapsed, 30*time.Second, "%s", out)
	assert.Empty(t, out.Results, "no rank may finish:\n%s", out)
	assert.Regexp(t, `rank 1\b`, out.Stdout+out.Stderr, "mpirun must say which rank failed:\n%s", out)
	t.Logf("job ended %s after the kill was due; exit code %s", out.Elapsed, strconv.Itoa(out.ExitCode))
}

// resizeReport is what rank 0 of a phase of TestMPIResumeOnAnotherWorldSize reports.
type resizeReport struct {
	Final testmodel.Snapshot  `json:"final"`
	Curve []float64           `json:"curve"`
	Place prepare.LoaderState `json:"place"`
}

// TestMPIResumeOnAnotherWorldSize: a checkpoint saved at an optimizer-step boundary by `mpirun -np 2`
// (2 processes × K=2 × batch 2) resumes in new processes under `mpirun -np 4` (4 × 1 × 2) and `-np 1`
// (1 × 2 × 4); each ends with the weights of the uninterrupted 2-process run within 1e-5 and the same
// loss curve within 1e-4.
func TestMPIResumeOnAnotherWorldSize(t *testing.T) {
	const epochs, stopAfter = 2, 4
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			k, _ := strconv.Atoi(os.Getenv("GOACCEL_TEST_K"))
			b, _ := strconv.Atoi(os.Getenv("GOACCEL_TEST_BATCH"))
			acc, err := accel.New(accel.WithBackend("go"), accel.WithGradientAccumulationSteps(k), accel.WithSeed(11))
			if err != nil {
				return nil, err
			}
			defer acc.Close()
			r := prepareResumableWith(t, acc, testmodel.SGD, resizeExamples, b, 1)
			dir := os.Getenv("GOACCEL_TEST_CHECKPOINTS")
			var rep resizeReport
			switch os.Getenv("GOACCEL_TEST_PHASE") {
			case "straight":
				rep.Curve, err = r.trainCurve(acc, epochs, 0)
			case "first":
				if rep.Curve, err = r.trainCurve(acc, epochs, stopAfter); err == nil {
					_, err = acc.SaveState(dir)
				}
			case "resume":
				if err = acc.LoadState(dir); err == nil {
					rep.Place = r.loader.State()
					rep.Curve, err = r.trainCurve(acc, epochs, 0)
				}
			}
			if err != nil {
				return nil, err
			}
			rep.Final, err = testmodel.TakeSnapshot(r.model.Parameters())
			return rep, err
		})
		return
	}
	dir := t.TempDir()
	phase := func(np, k, b int, name string) resizeReport {
		results := mpitest.Run(t, np, t.Name(), mpitest.WithEnv("GOACCEL_TEST_PHASE="+name,
			"GOACCEL_TEST_CHECKPOINTS="+dir, fmt.Sprintf("GOACCEL_TEST_K=%d", k), fmt.Sprintf("GOACCEL_TEST_BATCH=%d", b)),
			mpitest.WithTimeout(3*time.Minute))
		var rep resizeReport
		require.NoError(t, results[0].Decode(&rep))
		return rep
	}
	straight := phase(2, 2, 2, "straight")
	first := phase(2, 2, 2, "first")
	require.Len(t, first.Curve, stopAfter)
	for _, to := range []struct{ np, k, b int }{{4, 1, 2}, {1, 2, 4}} {
		t.Run(fmt.Sprintf("-np %d", to.np), func(t *testing.T) {
			resumed := phase(to.np, to.k, to.b, "resume")
			assert.Equal(t, prepare.LoaderState{Epoch: 0, Consumed: stopAfter * 8}, resumed.Place)
			moved, _, err := testmodel.MaxRelativeError(allVariables(resumed.Final.Context()), first.Final.Context())
			require.NoError(t, err)
			require.Greater(t, moved, 1e-3, "the resumed run trained: the comparison is not vacuous")
			worst, name, err := testmodel.MaxRelativeError(allVariables(resumed.Final.Context()), straight.Final.Context())
			require.NoError(t, err)
			assert.LessOrEqual(t, worst, 1e-5, "variable %s", name)
			curve := append(slices.Clone(first.Curve), resumed.Curve...)
			require.Len(t, curve, len(straight.Curve))
			for i := range curve {
				assert.InDelta(t, straight.Curve[i], curve[i], 1e-4, "optimizer step %d's loss", i+1)
			}
		})
	}
}
