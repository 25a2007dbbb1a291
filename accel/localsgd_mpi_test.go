package accel_test

import (
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

type localSGDMPIReport struct {
	// Digests are the parameters' digests after each optimizer step, Since the steps since the average.
	Digests []string `json:"digests"`
	Since   []int    `json:"since"`
	// Syncs, AllReduces and Averages are the run's gradient syncs, all-reduce calls and parameter averages;
	// Buckets is the plan's bucket count.
	Syncs      int64 `json:"syncs"`
	AllReduces int64 `json:"all_reduces"`
	Averages   int64 `json:"averages"`
	Buckets    int   `json:"buckets"`
	Steps      int64 `json:"steps"`
}

// TestMPILocalSGD: DiLoCo with H=4 and Adam under mpirun -np 2 on the MPI engine: the processes' parameters
// are bitwise equal right after each average and differ in between; no gradient is all-reduced, and each
// average is one all-reduce per bucket.
func TestMPILocalSGD(t *testing.T) {
	const h, b, steps = 4, 2, 12
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(func(keeper *backends.Communicator) (any, error) {
			acc, err := accel.New(accel.WithBackend("go"), accel.WithDiLoCo(h, 0.7, 0.9), accel.WithBucketCapMB(0.0002))
			if err != nil {
				return nil, err
			}
			defer acc.Close()
			r := prepareResumableWith(t, acc, testmodel.Adam, keeper.Size()*b*steps, b, 1)
			var rep localSGDMPIReport
			err = r.loop(acc, 1, func(_ float64, stepped bool) (bool, error) {
				if !stepped {
					return false, fmt.Errorf("step %d was not applied", r.opt.Steps()+1)
				}
				d, err := replicas.VariablesDigest(r.model.Parameters())
				rep.Digests = append(rep.Digests, hex.EncodeToString(d[:]))
				rep.Since = append(rep.Since, r.opt.LocalStepsSinceAverage())
				return false, err
			})
			if err != nil {
				return nil, err
			}
			stats := acc.Stats()
			rep.Syncs, rep.Averages, rep.Steps = stats.Syncs, stats.ParameterAverages, stats.OptimizerSteps
			rep.AllReduces = stats.Collectives.Of(backends.OpAllReduce).Calls
			rep.Buckets = len(r.model.Plan().Buckets)
			return rep, nil
		}))
		return
	}
	results := mpitest.Run(t, 2, "TestMPILocalSGD", mpitest.WithTimeout(3*time.Minute))
	reports := make([]localSGDMPIReport, len(results))
	for r, res := range results {
		require.NoError(t, res.Decode(&reports[r]))
	}
	require.Len(t, reports, 2)
	for r, rep := range reports {
		require.EqualValues(t, steps, rep.Steps, "rank %d", r)
		require.Len(t, rep.Digests, steps)
		assert.Zero(t, rep.Syncs, "rank %d: no gradient sync", r)
		assert.EqualValues(t, steps/h, rep.Averages, "rank %d", r)
		assert.Greater(t, rep.Buckets, 1)
		assert.EqualValues(t, steps/h*rep.Buckets, rep.AllReduces, "rank %d: one all-reduce per bucket per average", r)
	}
	for s := range steps {
		since := (s + 1) % h
		assert.Equal(t, since, reports[0].Since[s], "step %d", s+1)
		if since == 0 {
			assert.Equal(t, reports[0].Digests[s], reports[1].Digests[s], "step %d: right after an average", s+1)
		} else {
			assert.NotEqual(t, reports[0].Digests[s], reports[1].Digests[s], "step %d: between averages", s+1)
		}
	}
}
