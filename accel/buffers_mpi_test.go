package accel_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// mpiBufferReport is what each rank of TestMPIBuffers reports.
type mpiBufferReport struct {
	// Runs are the bufferCases' runs, by name.
	Runs map[string]bufferRun `json:"runs"`
	// Straight never stops; Saved stops inside an accumulation cycle and saves; Resumed loads that in a
	// fresh Accelerator and trains on.
	Straight bufferState `json:"straight"`
	Saved    bufferState `json:"saved"`
	Resumed  bufferState `json:"resumed"`
}

// mpiBufferPhase runs one resumable batch-normalisation job in a fresh Accelerator (K=2): it loads load (if
// any), trains to the end of 2 epochs or stop micro-batches, saves into save (if any), and reports.
func mpiBufferPhase(n int, load, save string, stop int) (bufferState, error) {
	acc, err := accel.New(accel.WithBackend("go"), accel.WithGradientAccumulationSteps(2), accel.WithSeed(11))
	if err != nil {
		return bufferState{}, err
	}
	defer acc.Close()
	r, err := prepareBufferResumable(acc, n)
	if err != nil {
		return bufferState{}, err
	}
	if load != "" {
		if err := acc.LoadState(load); err != nil {
			return bufferState{}, err
		}
	}
	if err := r.train(acc, 2, stop); err != nil {
		return bufferState{}, err
	}
	if save != "" {
		if _, err := acc.SaveState(save); err != nil {
			return bufferState{}, err
		}
	}
	return r.report()
}

func mpiBufferRank(keeper *backends.Communicator) (any, error) {
	rep := mpiBufferReport{Runs: map[string]bufferRun{}}
	for _, c := range bufferCases {
		opts := append([]accel.Option{accel.WithBackend("go"), accel.WithSeed(5), accel.WithReplicaCheck()}, c.opts...)
		acc, err := accel.New(opts...)
		if err != nil {
			return nil, err
		}
		run, err := trainBuffers(acc, c.loop, 3)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		rep.Runs[c.name] = run
		if err := acc.Close(); err != nil {
			return nil, err
		}
	}
	n := keeper.Size() * 4 * 5 // five micro-batches per process and epoch, as TestBufferCheckpoints
	mid := filepath.Join(os.Getenv("GOACCEL_TEST_CHECKPOINTS"), "mid-cycle")
	var err error
	if rep.Straight, err = mpiBufferPhase(n, "", "", 0); err != nil {
		return nil, err
	}
	if rep.Saved, err = mpiBufferPhase(n, "", mid, 6); err != nil {
		return nil, err
	}
	rep.Resumed, err = mpiBufferPhase(n, mid, "", 0)
	return rep, err
}

// TestMPIBuffers: TestBuffersAcrossRanks and TestBufferCheckpoints under mpirun with 2 and 4 processes:
// batch normalisation's moving averages are synchronised after every micro-batch an optimizer step
// follows (K=1, K=2, sync-each-batch, NoSync; rank 0's, or their mean with AverageBuffers), the replica
// check passes after every step and every process predicts the same; with NoBufferSync they diverge. A
// run saved inside an accumulation cycle holds rank 0's buffers and resumes in fresh Accelerators bitwise
// as the run that never stopped.
func TestMPIBuffers(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(mpiBufferRank))
		return
	}
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			dir := t.TempDir()
			results := mpitest.Run(t, np, "TestMPIBuffers", mpitest.WithEnv("GOACCEL_TEST_CHECKPOINTS="+dir),
				mpitest.WithTimeout(5*time.Minute))
			reps := make([]mpiBufferReport, np)
			for r, res := range results {
				require.NoError(t, res.Decode(&reps[r]), "rank %d", r)
			}
			for _, c := range bufferCases {
				t.Run(c.name, func(t *testing.T) {
					runs := make([]bufferRun, np)
					for r, rep := range reps {
						runs[r] = rep.Runs[c.name]
					}
					checkBufferRanks(t, runs, 3, c.mode != accel.NoBufferSync, c.mode == accel.BroadcastBuffers)
				})
			}
			names := slices.Sorted(func(yield func(string) bool) {
				for name := range reps[0].Straight.Values {
					if !yield(name) {
						return
					}
				}
			})
			require.Len(t, names, 3, "mean, variance and avg_weight")
			assert.Equal(t, reps[0].Saved.Values, checkpointBuffers(t, filepath.Join(dir, "mid-cycle"), names))
			for r, rep := range reps {
				assert.Equal(t, rep.Straight, rep.Resumed, "rank %d: the resumed run must end bitwise as the straight one", r)
				assert.Equal(t, reps[0].Straight, rep.Straight, "rank %d's buffers, weights and predictions", r)
				if r > 0 {
					assert.NotEqual(t, reps[0].Saved.Values, rep.Saved.Values, "rank %d updated its own inside the cycle", r)
				}
			}
		})
	}
}
