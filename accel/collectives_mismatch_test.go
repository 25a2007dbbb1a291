package accel_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/replicas"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
)

func vector(values ...float32) *tensors.Tensor { return tensors.FromValue(values) }

// collectiveCalls are the user-facing collectives, as a rank calls them.
var collectiveCalls = map[string]func(acc *accel.Accelerator) error{
	"Gather":    func(acc *accel.Accelerator) error { _, err := acc.Gather(vector(1, 10, 100, 1000)); return err },
	"Gather[3]": func(acc *accel.Accelerator) error { _, err := acc.Gather(vector(1, 10, 100)); return err },
	"Reduce(Sum)": func(acc *accel.Accelerator) error {
		_, err := acc.Reduce(vector(1, 10, 100, 1000), accel.Sum)
		return err
	},
	"Reduce(Mean)": func(acc *accel.Accelerator) error {
		_, err := acc.Reduce(vector(1, 10, 100, 1000), accel.Mean)
		return err
	},
	"Reduce(nil)":     func(acc *accel.Accelerator) error { _, err := acc.Reduce(nil, accel.Sum); return err },
	"Broadcast":       func(acc *accel.Accelerator) error { return acc.Broadcast(vector(1, 10, 100, 1000), 0) },
	"WaitForEveryone": func(acc *accel.Accelerator) error { return acc.WaitForEveryone() },
}

// collectiveMismatches: the other ranks make the first call, the last rank the second; the error must
// contain want (with %[1]d the last rank and %[2]s the ranks before it).
var collectiveMismatches = map[string]struct {
	others, last string
	want         string
}{
	"Broadcast against Gather":  {"Broadcast", "Gather", "disagree on the collective called: %[2]s Broadcast(root 0); rank %[1]d has Gather"},
	"Reduce against Broadcast":  {"Reduce(Sum)", "Broadcast", "disagree on the collective called: %[2]s Reduce(Sum); rank %[1]d has Broadcast(root 0)"},
	"Sum against Mean":          {"Reduce(Sum)", "Reduce(Mean)", "rank %[1]d has Reduce(Mean)"},
	"Gather shapes":             {"Gather", "Gather[3]", "disagree on the tensor passed to Gather: %[2]s (Float32)[4]; rank %[1]d has (Float32)[3]"},
	"WaitForEveryone vs Gather": {"WaitForEveryone", "Gather", "rank %[1]d has Gather"},
	"nil tensor":                {"Reduce(Sum)", "Reduce(nil)", "disagree on the tensor passed to Reduce(Sum): %[2]s (Float32)[4]; rank %[1]d has none"},
}

// TestMPICollectiveMismatch: under mpirun with 2 and 4 ranks, the last rank calling another user-facing
// collective than the others, or the same one with another shape, reduction or a nil tensor, makes every
// rank fail with an error naming the calls and the ranks — never garbage, MPI_ERR_TRUNCATE or a hang —
// and the accelerator stays usable.
func TestMPICollectiveMismatch(t *testing.T) {
	type report struct {
		Errors map[string]string
		Sum    []float32
	}
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			acc, err := accel.New(accel.WithBackend("go"), accel.WithCollectiveTimeout(time.Minute))
			if err != nil {
				return nil, err
			}
			rep := report{Errors: map[string]string{}}
			// Every rank must run the cases in the same order: their collectives match by order.
			for _, name := range slices.Sorted(maps.Keys(collectiveMismatches)) {
				c := collectiveMismatches[name]
				call := c.others
				if acc.Rank() == acc.WorldSize()-1 {
					call = c.last
				}
				if err := collectiveCalls[call](acc); err != nil {
					rep.Errors[name] = err.Error()
				}
			}
			sum, err := acc.Reduce(vector(1, 10, 100, 1000), accel.Sum)
			if err != nil {
				return nil, err
			}
			rep.Sum = tensors.MustCopyFlatData[float32](sum)
			return rep, acc.Close()
		})
		return
	}
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			results := mpitest.Run(t, np, t.Name(), mpitest.WithTimeout(time.Minute))
			before := "rank 0 has"
			if np == 4 {
				before = "ranks 0, 1 and 2 have"
			}
			for r, res := range results {
				var rep report
				require.NoError(t, res.Decode(&rep))
				for name, c := range collectiveMismatches {
					assert.Contains(t, rep.Errors[name], fmt.Sprintf(c.want, np-1, before), "%s, rank %d", name, r)
				}
				n := float32(np)
				assert.Equal(t, []float32{n, 10 * n, 100 * n, 1000 * n}, rep.Sum, "rank %d", r)
			}
		})
	}
}

// TestDebugModeChecksGradientSyncs: with WithDebug, every gradient sync is preceded by a check that all
// ranks make the same call, and training gives bitwise the same weights as without it.
func TestDebugModeChecksGradientSyncs(t *testing.T) {
	digests := map[bool][][32]byte{}
	for _, debug := range []bool{false, true} {
		opts := []accel.Option{accel.WithGradientAccumulationSteps(2), accel.WithBucketCapMB(0.0001)}
		if debug {
			opts = append(opts, accel.WithDebug())
		}
		digests[debug] = make([][32]byte, 2)
		runRanks(t, 2, opts, func(rank int, acc *accel.Accelerator) error {
			inputs, labels := testmodel.Data(2*2*2*3, 1)
			res, err := testmodel.Run{Kind: testmodel.Adam, Inputs: inputs, Labels: labels, BatchSize: 2}.Train(acc)
			if err != nil {
				return err
			}
			stats := acc.Stats().Collectives
			allReduces, allGathers := stats.Of(backends.OpAllReduce).Calls, stats.Of(backends.OpAllGather).Calls
			if debug {
				assert.GreaterOrEqual(t, allGathers, allReduces, "rank %d: every all-reduce is checked", rank)
			} else {
				assert.Less(t, allGathers, allReduces, "rank %d: without debug mode syncs are not checked", rank)
			}
			digests[debug][rank], err = replicas.VariablesDigest(res.Model.ReplicatedVariables())
			return err
		})
	}
	assert.Equal(t, digests[false], digests[true])
}
