package main

import (
	"encoding/binary"
	"hash/fnv"
	"io"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/datasets/fashionmnist"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// rankReport is what each process of TestTwoProcesses reports.
type rankReport struct {
	WorldSize      int     `json:"world_size"`
	Accuracy       float64 `json:"accuracy"`
	FinalLoss      float64 `json:"final_loss"`
	OptimizerSteps int64   `json:"optimizer_steps"`
	Collectives    int64   `json:"collectives"`
	// Weights is a digest of the trainable parameters' bits after training, Buffers of the variables the
	// training step writes besides them (batch normalization's running averages and its batch count).
	Weights uint64 `json:"weights"`
	Buffers uint64 `json:"buffers"`
	// BufferVariables is the number of variables in Buffers.
	BufferVariables int `json:"buffer_variables"`
}

// TestTwoProcesses trains the program's model with its own train and evaluate functions as the 2 ranks of
// a real mpirun job, on a subset of Fashion-MNIST (2 × 32 = 64 examples per optimizer step): the gradients
// cross processes, both ranks end with the same trainable weights and batch-normalization averages, bit for
// bit (accel.BroadcastBuffers, the default, gives both rank 0's averages as PyTorch DDP does), and the same
// test accuracy (every test example scored once over both), far above chance.
func TestTwoProcesses(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, func() (any, error) { return trainAsRank() })
		return
	}
	requireDataset(t)
	var reports []rankReport
	for _, r := range mpitest.Run(t, 2, t.Name()) {
		var rep rankReport
		require.NoError(t, r.Decode(&rep))
		reports = append(reports, rep)
	}
	for rank, rep := range reports {
		assert.Equal(t, 2, rep.WorldSize, "rank %d", rank)
		assert.EqualValues(t, 64, rep.OptimizerSteps, "rank %d: 4096 examples / 64 per step", rank)
		assert.Greater(t, rep.Collectives, rep.OptimizerSteps, "rank %d: a gradient sync per step, and more", rank)
		assert.Equal(t, 6*3, rep.BufferVariables, "rank %d: 6 batch normalizations, each a mean, a variance and a count", rank)
	}
	assert.Equal(t, reports[0].Weights, reports[1].Weights, "the replicas' trainable weights are identical")
	assert.Equal(t, reports[0].Buffers, reports[1].Buffers, "and so are their running averages")
	assert.Equal(t, reports[0].Accuracy, reports[1].Accuracy)
	assert.Equal(t, reports[0].FinalLoss, reports[1].FinalLoss, "the job's mean loss, all-reduced")
	assert.Greater(t, reports[0].Accuracy, 0.5, "test accuracy after one epoch of 4096 examples")
	t.Logf("2 processes: test accuracy %.4f, final loss %.4f", reports[0].Accuracy, reports[0].FinalLoss)
}

// trainAsRank is one rank's job in TestTwoProcesses.
func trainAsRank() (rankReport, error) {
	var rep rankReport
	cfg, err := parseFlags([]string{"-limit", "4096", "-epochs", "1", "-batch", "32", "-quiet"}, io.Discard)
	if err != nil {
		return rep, err
	}
	acc, err := accel.New(accel.WithGradientAccumulationSteps(cfg.k), accel.WithSeed(cfg.seed), accel.WithOutput(io.Discard))
	if err != nil {
		return rep, err
	}
	defer func() { _ = acc.CloseWithError(err) }()
	trainSet, testSet, err := fashionmnist.Load(cfg.dataDir, fashionmnist.Limit(cfg.limit))
	if err != nil {
		return rep, err
	}
	res, err := train(acc, cfg, trainSet)
	if err != nil {
		return rep, err
	}
	if rep.Accuracy, err = evaluate(acc, res.model, testSet); err != nil {
		return rep, err
	}
	rep.WorldSize, rep.FinalLoss = acc.WorldSize(), res.finalLoss
	rep.OptimizerSteps, rep.Collectives = res.stats.OptimizerSteps, res.stats.Collectives.Calls()
	trainable := map[string]bool{}
	for _, v := range res.model.Parameters() {
		trainable[v.ScopeAndName()] = true
	}
	weights, buffers := fnv.New64a(), fnv.New64a()
	for v := range res.model.Context().IterVariables() {
		h := buffers
		switch {
		case trainable[v.ScopeAndName()]:
			h = weights
		case !strings.HasSuffix(v.Scope(), "/batch_normalization") || strings.HasPrefix(v.Scope(), "/AdamOptimizer/"):
			continue // the optimizer's state and step counts, the gradient accumulators, the generator
		}
		value, err := v.Value()
		if err != nil {
			return rep, err
		}
		if h == buffers {
			rep.BufferVariables++
		}
		_, _ = h.Write([]byte(v.ScopeAndName()))
		_ = binary.Write(h, binary.LittleEndian, tensors.MustCopyFlatData[float32](value))
	}
	rep.Weights, rep.Buffers = weights.Sum64(), buffers.Sum64()
	return rep, nil
}
