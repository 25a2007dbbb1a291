package accel_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/prepare"
)

// mpiDropoutReport is what each rank of TestMPIDropout reports.
type mpiDropoutReport struct {
	// Train is the dropout run with the replica check after every step.
	Train dropoutRun `json:"train"`
	// Straight never stops; Saved stops inside a cycle and saves; Resumed loads that and trains on.
	Straight dropoutRun `json:"straight"`
	Saved    dropoutRun `json:"saved"`
	Resumed  dropoutRun `json:"resumed"`
	// Boundary stops at an optimizer-step boundary and saves, for another world size to load (np=2);
	// Loaded is this run after loading such a checkpoint of another world size (np=4).
	Boundary *dropoutRun `json:"boundary,omitempty"`
	Loaded   *dropoutRun `json:"loaded,omitempty"`
}

// mpiDropoutExamples divides by the batches of 2 and 4 processes.
const mpiDropoutExamples = 40

// mpiDropoutPhase runs one resumable dropout job in a fresh Accelerator: it loads load (if any), trains to
// the end of 2 epochs or stop micro-batches, saves into save (if any), and reports.
func mpiDropoutPhase(load, save string, stop int) (dropoutRun, error) {
	acc, err := accel.New(accel.WithBackend("go"), accel.WithGradientAccumulationSteps(2), accel.WithSeed(3))
	if err != nil {
		return dropoutRun{}, err
	}
	defer acc.Close()
	r, err := prepareDropoutResumable(acc, mpiDropoutExamples)
	if err != nil {
		return dropoutRun{}, err
	}
	if load != "" {
		if err := acc.LoadState(load); err != nil {
			return dropoutRun{}, err
		}
	}
	if stop >= 0 {
		if err := r.train(acc, 2, stop); err != nil {
			return dropoutRun{}, err
		}
	}
	if save != "" {
		if _, err := acc.SaveState(save); err != nil {
			return dropoutRun{}, err
		}
	}
	return r.report()
}

func mpiDropoutRank(*backends.Communicator) (any, error) {
	var rep mpiDropoutReport
	dir := os.Getenv("GOACCEL_TEST_CHECKPOINTS")
	acc, err := accel.New(accel.WithBackend("go"), accel.WithGradientAccumulationSteps(2), accel.WithSeed(7),
		accel.WithReplicaCheck())
	if err != nil {
		return nil, err
	}
	rep.Train, err = trainDropout(acc, 3)
	if err != nil {
		return nil, err
	}
	if err := acc.Close(); err != nil {
		return nil, err
	}
	mid := filepath.Join(dir, "mid-cycle")
	if rep.Straight, err = mpiDropoutPhase("", "", 0); err != nil {
		return nil, err
	}
	if rep.Saved, err = mpiDropoutPhase("", mid, 7); err != nil { // K=2: inside the 4th cycle
		return nil, err
	}
	if rep.Resumed, err = mpiDropoutPhase(mid, "", 0); err != nil {
		return nil, err
	}
	if other := os.Getenv("GOACCEL_TEST_LOAD"); other != "" {
		loaded, err := mpiDropoutPhase(other, "", -1)
		rep.Loaded = &loaded
		return rep, err
	}
	boundary, err := mpiDropoutPhase("", filepath.Join(dir, "boundary"), 4)
	rep.Boundary = &boundary
	return rep, err
}

// TestMPIDropout: under mpirun with 2 and 4 processes, a model with dropout trains with Adam (K=2) with
// the replica check after every step: each process draws its own masks, from rank 0's state derived with
// its rank, and the weights stay bitwise identical. A run saved inside an accumulation cycle resumes in a
// fresh Accelerator bitwise as the run that never stopped, generator states included; a checkpoint saved
// at a step boundary by 2 processes loads on 4, ranks 0 and 1 taking their saved states and ranks 2 and
// 3 rank 0's derived with their rank.
func TestMPIDropout(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(mpiDropoutRank))
		return
	}
	mpitest.RequireMPIRun(t) // the 4-process job loads what the 2-process one saved: both run, or neither
	root := t.TempDir()
	reports := map[int][]mpiDropoutReport{}
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			dir := filepath.Join(root, strconv.Itoa(np))
			env := []string{"GOACCEL_TEST_CHECKPOINTS=" + dir}
			if np == 4 {
				require.Len(t, reports[2], 2, "the 2-process job saved the checkpoint this one loads")
				env = append(env, "GOACCEL_TEST_LOAD="+filepath.Join(root, "2", "boundary"))
			}
			results := mpitest.Run(t, np, "TestMPIDropout", mpitest.WithEnv(env...),
				mpitest.WithTimeout(5*time.Minute))
			reps := make([]mpiDropoutReport, np)
			trains := make([]dropoutRun, np)
			for r, res := range results {
				require.NoError(t, res.Decode(&reps[r]), "rank %d", r)
				trains[r] = reps[r].Train
			}
			checkDropoutRanks(t, trains)
			states := savedRNGStates(t, filepath.Join(dir, "mid-cycle"))
			require.Len(t, states, np)
			for r, rep := range reps {
				assert.Equal(t, rep.Saved.Final, states[r], "rank %d's state in the checkpoint", r)
				assert.Equal(t, rep.Straight, rep.Resumed, "rank %d: the resumed run must end bitwise as the "+
					"straight one", r)
				assert.Equal(t, reps[0].Straight.Digest, rep.Straight.Digest, "rank %d's weights", r)
				for q := range r {
					assert.NotEqual(t, reps[q].Straight.Final, rep.Straight.Final, "ranks %d and %d", q, r)
				}
			}
			if np == 2 {
				reports[np] = reps
				return
			}
			saved := reports[2]
			for r, rep := range reps {
				require.NotNil(t, rep.Loaded, "rank %d", r)
				want := prepare.DeriveRNGState(saved[0].Boundary.Final, r)
				if r < len(saved) {
					want = saved[r].Boundary.Final
				}
				assert.Equal(t, want, rep.Loaded.Final, "rank %d's generator state", r)
				assert.Equal(t, saved[0].Boundary.Digest, rep.Loaded.Digest, "rank %d's weights", r)
			}
		})
	}
}
