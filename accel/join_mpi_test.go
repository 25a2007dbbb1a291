package accel_test

import (
	"encoding/hex"
	"fmt"
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

// joinMPIData are the processes' uneven data of TestJoinMPI, by world size.
var joinMPIData = map[int]unevenData{
	2: {batches: []int{9, 1}, sizes: []int{2, 5}},
	4: {batches: []int{2, 7, 0, 4}, sizes: []int{3, 1, 2, 2}},
}

type joinMPIReport struct {
	Initial testmodel.Snapshot `json:"initial"`
	Final   testmodel.Snapshot `json:"final"`
	Digest  string             `json:"digest"`
	Steps   int64              `json:"steps"`
}

// TestJoinMPI: under mpirun with 2 and 4 processes whose data differ wildly (9 batches against 1; 2, 7, 0
// and 4), Join ends without a deadlock, every process takes every optimizer step and ends with the same
// weights, those of one process stepping on the union of each step's examples.
func TestJoinMPI(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(joinMPIRank))
		return
	}
	for _, np := range []int{2, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			results := mpitest.Run(t, np, "TestJoinMPI", mpitest.WithTimeout(3*time.Minute))
			reports := make([]joinMPIReport, np)
			for r, res := range results {
				require.NoError(t, res.Decode(&reports[r]))
			}
			data := joinMPIData[np]
			most := 0
			for _, n := range data.batches {
				most = max(most, n)
			}
			for r := range np {
				assert.Equal(t, reports[0].Digest, reports[r].Digest, "rank %d's replica", r)
				assert.EqualValues(t, most, reports[r].Steps, "rank %d's optimizer steps", r)
			}
			inputs, labels := testmodel.Data(data.rows(), 9)
			backend, err := cpu.New(cpu.Config{Backend: "go"})
			require.NoError(t, err)
			ref := reports[0].Initial.Context()
			require.NoError(t, testmodel.ReferenceTrain(backend, ref, testmodel.Adam, data.reference(inputs, labels, 1)))
			worst, name, err := testmodel.MaxRelativeError(allVariables(reports[0].Final.Context()), ref)
			require.NoError(t, err)
			assert.LessOrEqual(t, worst, 1e-5, "variable %s", name)
		})
	}
}

func joinMPIRank(keeper *backends.Communicator) (any, error) {
	data := joinMPIData[keeper.Size()]
	inputs, labels := testmodel.Data(data.rows(), 9)
	acc, err := accel.New(accel.WithBackend("go"))
	if err != nil {
		return nil, err
	}
	defer acc.Close()
	model, err := acc.PrepareModel(context.New(), testmodel.MLP, testmodel.Loss)
	if err != nil {
		return nil, err
	}
	opt, err := acc.PrepareOptimizer(model, testmodel.NewOptimizer(testmodel.Adam))
	if err != nil {
		return nil, err
	}
	x, _ := testmodel.Data(2, 1)
	if err := model.Materialize(prepare.Batch{Inputs: []*tensors.Tensor{x}, Labels: []*tensors.Tensor{testmodel.Rows(labels, 0, 2)}}); err != nil {
		return nil, err
	}
	var rep joinMPIReport
	if rep.Initial, err = testmodel.TakeSnapshot(model.Parameters()); err != nil {
		return nil, err
	}
	mine := data.rankBatches(inputs, labels, acc.Rank())
	err = acc.Join(model, opt, func() error { return trainOn(acc, model, opt, mine) })
	if err != nil {
		return nil, err
	}
	rep.Steps = opt.Steps()
	if rep.Final, err = testmodel.TakeSnapshot(model.Parameters()); err != nil {
		return nil, err
	}
	d, err := replicas.VariablesDigest(model.ReplicatedVariables())
	rep.Digest = hex.EncodeToString(d[:])
	return rep, err
}
