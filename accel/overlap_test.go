package accel_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

// overlapRun is one in-process training run for TestOverlapExact: every rank's final weights, rank 0's
// counters and how many buckets its steps started from inside themselves.
type overlapRun struct {
	final      []*testmodel.Snapshot
	stats      accel.Stats
	buckets    int
	overlapped int64
}

func trainOverlap(t *testing.T, ranks int, opts []accel.Option, run testmodel.Run) overlapRun {
	t.Helper()
	out := overlapRun{final: make([]*testmodel.Snapshot, ranks)}
	runRanks(t, ranks, opts, func(rank int, acc *accel.Accelerator) error {
		res, err := run.Train(acc)
		if err != nil {
			return err
		}
		s, err := testmodel.TakeSnapshot(res.Model.Parameters())
		if err != nil {
			return err
		}
		out.final[rank] = &s
		if rank == 0 {
			out.stats = acc.Stats()
			out.buckets = len(res.Model.Plan().Buckets)
			out.overlapped = res.Model.Reducer().OverlappedBuckets()
		}
		return nil
	})
	return out
}

// TestOverlapExact: with the sync overlapping the backward pass, N ranks train bitwise the same weights as
// without it, with the same counters (one sync per optimizer step, each bucket all-reduced once, the same
// bytes), and the steps really started their buckets from inside themselves; with K micro-batches, with
// NoSync-style accumulation and with sync-each-batch, and with a compressing comm hook.
func TestOverlapExact(t *testing.T) {
	const b, steps = 4, 3
	for _, tc := range []struct {
		ranks, k  int
		eachBatch bool
		format    accumulate.Compression
	}{
		{2, 1, false, accumulate.NoCompression},
		{2, 4, false, accumulate.NoCompression},
		{4, 1, false, accumulate.NoCompression},
		{4, 4, false, accumulate.NoCompression},
		{2, 3, true, accumulate.NoCompression},
		{2, 1, false, accumulate.BF16},
	} {
		t.Run(fmt.Sprintf("ranks=%d/K=%d/each=%v/%s", tc.ranks, tc.k, tc.eachBatch, tc.format), func(t *testing.T) {
			inputs, labels := testmodel.Data(tc.ranks*tc.k*b*steps, 1)
			run := testmodel.Run{Kind: testmodel.Adam, Inputs: inputs, Labels: labels, BatchSize: b}
			// A tiny bucket cap gives the model one bucket per parameter: several buckets per step.
			opts := []accel.Option{accel.WithGradientAccumulationSteps(tc.k), accel.WithBucketCapMB(1e-6),
				accel.WithGradientCompression(tc.format)}
			if tc.eachBatch {
				opts = append(opts, accel.WithSyncEachBatch())
			}
			off := trainOverlap(t, tc.ranks, append(opts, accel.WithOverlap(false)), run)
			on := trainOverlap(t, tc.ranks, append(opts, accel.WithOverlap(true)), run)
			require.Greater(t, on.buckets, 1)
			assert.Zero(t, off.overlapped)
			assert.EqualValues(t, steps*on.buckets, on.overlapped, "buckets started inside the steps")
			for r := range tc.ranks {
				assert.Equal(t, off.final[r], on.final[r], "rank %d's weights", r)
			}
			assert.Equal(t, off.final[0], on.final[tc.ranks-1], "the replicas")
			assert.Equal(t, off.stats.Syncs, on.stats.Syncs)
			if !tc.eachBatch {
				assert.EqualValues(t, steps, on.stats.Syncs)
			}
			offAR, onAR := off.stats.Collectives.Of(backends.OpAllReduce), on.stats.Collectives.Of(backends.OpAllReduce)
			assert.Equal(t, offAR.Calls, onAR.Calls, "all-reduces")
			assert.Equal(t, offAR.Bytes, onAR.Bytes, "all-reduced bytes")
		})
	}
}

// overlapReport is what a rank of TestMPIOverlapExact reports, by run.
type overlapReport struct {
	Final      testmodel.Snapshot `json:"final"`
	Stats      accel.Stats        `json:"stats"`
	Overlapped int64              `json:"overlapped"`
	Buckets    int                `json:"buckets"`
}

// TestMPIOverlapExact is TestOverlapExact's check in a real MPI job of 2 processes, where the buckets'
// all-reduces run on Open MPI and the progress goroutine polls them while the steps compute: K=1 and K=4,
// overlap off and on, bitwise the same weights and counters.
func TestMPIOverlapExact(t *testing.T) {
	const b, steps = 2, 3
	ks := []int{1, 4}
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(func(keeper *backends.Communicator) (any, error) {
			reports := map[string]overlapReport{}
			for _, k := range ks {
				for _, on := range []bool{false, true} {
					inputs, labels := testmodel.Data(keeper.Size()*k*b*steps, 1)
					acc, err := accel.New(accel.WithBackend("go"), accel.WithGradientAccumulationSteps(k),
						accel.WithBucketCapMB(1e-6), accel.WithOverlap(on))
					if err != nil {
						return nil, err
					}
					res, err := testmodel.Run{Kind: testmodel.Adam, Inputs: inputs, Labels: labels, BatchSize: b}.Train(acc)
					if err != nil {
						return nil, err
					}
					rep := overlapReport{Stats: acc.Stats(), Overlapped: res.Model.Reducer().OverlappedBuckets(),
						Buckets: len(res.Model.Plan().Buckets)}
					if rep.Final, err = testmodel.TakeSnapshot(res.Model.Parameters()); err != nil {
						return nil, err
					}
					reports[fmt.Sprintf("K=%d/on=%v", k, on)] = rep
					if err := acc.Close(); err != nil {
						return nil, err
					}
				}
			}
			return reports, nil
		}))
		return
	}
	const np = 2
	results := mpitest.Run(t, np, "TestMPIOverlapExact", mpitest.WithTimeout(3*time.Minute))
	reports := make([]map[string]overlapReport, np)
	for r, res := range results {
		require.NoError(t, res.Decode(&reports[r]))
	}
	for _, k := range ks {
		off, on := fmt.Sprintf("K=%d/on=false", k), fmt.Sprintf("K=%d/on=true", k)
		for r := range np {
			assert.Equal(t, reports[r][off].Final, reports[r][on].Final, "K=%d: rank %d's weights", k, r)
			assert.Zero(t, reports[r][off].Overlapped)
			assert.EqualValues(t, steps*reports[r][on].Buckets, reports[r][on].Overlapped, "K=%d: rank %d", k, r)
			offAR := reports[r][off].Stats.Collectives.Of(backends.OpAllReduce)
			onAR := reports[r][on].Stats.Collectives.Of(backends.OpAllReduce)
			assert.Equal(t, offAR.Calls, onAR.Calls)
			assert.Equal(t, offAR.Bytes, onAR.Bytes)
			assert.Equal(t, reports[r][off].Stats.Syncs, reports[r][on].Stats.Syncs)
		}
		assert.Equal(t, reports[0][on].Final, reports[1][on].Final, "K=%d: the replicas", k)
	}
}

// Overlap is off by default; the option (or GOACCEL_OVERLAP=1) turns it on. On one process there is no
// sync to overlap, so it changes nothing there.
func ExampleWithOverlap() {
	conf, err := accel.Resolve(accel.WithOverlap(true))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("overlap:", conf.Overlap)
	// Output: overlap: true
}
