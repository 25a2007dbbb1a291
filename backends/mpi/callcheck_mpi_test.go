package mpi_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// TestCallChecksAcrossProcesses: under mpirun with 2 and 4 ranks and call checks on, the last rank calling
// another collective than the others (a gather against a broadcast, a longer all-reduce) makes every rank
// fail with a *backends.MismatchError naming both calls, instead of MPI_ERR_TRUNCATE or silent garbage;
// the ranks then go on with matching collectives and close normally.
func TestCallChecksAcrossProcesses(t *testing.T) {
	type report struct {
		Errors []string
		Sum    float64
	}
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) {
			comm, _, err := openWorld(backends.WithCallChecks(), backends.WithTimeout(time.Minute))
			if err != nil {
				return nil, err
			}
			last := comm.Rank() == comm.Size()-1
			var rep report
			for _, calls := range [][2]func() error{
				{
					func() error { return comm.Broadcast(backends.BufferOf(make([]float32, 4)), 0) },
					func() error {
						return comm.AllGather(backends.BufferOf(make([]float32, 4)), backends.BufferOf(make([]float32, 4*comm.Size())))
					},
				},
				{
					func() error { return comm.AllReduceSum(backends.BufferOf(make([]float32, 4))) },
					func() error { return comm.AllReduceSum(backends.BufferOf(make([]float32, 8))) },
				},
			} {
				call := calls[0]
				if last {
					call = calls[1]
				}
				err := call()
				var merr *backends.MismatchError
				if !errors.As(err, &merr) {
					return nil, fmt.Errorf("want a *backends.MismatchError, got %v", err)
				}
				rep.Errors = append(rep.Errors, err.Error())
			}
			sum := []float64{1}
			if err := comm.AllReduceSum(backends.BufferOf(sum)); err != nil {
				return nil, err
			}
			rep.Sum = sum[0]
			return rep, comm.Close()
		})
		return
	}
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			results := mpitest.Run(t, np, t.Name(), mpitest.WithTimeout(time.Minute))
			for r, res := range results {
				var rep report
				require.NoError(t, res.Decode(&rep))
				require.Len(t, rep.Errors, 2)
				assert.Contains(t, rep.Errors[0], "called broadcast of float32[4] from root 0", "rank %d", r)
				assert.Contains(t, rep.Errors[0], fmt.Sprintf("rank %d called all-gather of float32[4]", np-1), "rank %d", r)
				assert.Contains(t, rep.Errors[1], fmt.Sprintf("rank %d called all-reduce of float32[8]", np-1), "rank %d", r)
				assert.Equal(t, float64(np), rep.Sum, "rank %d: the communicator must stay usable", r)
			}
		})
	}
}
