package accel_test

import (
	"bytes"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// batchSizeLimitEnv passes rank 1's memory limit to the ranks of TestFindExecutableBatchSizeMPI.
const batchSizeLimitEnv = "GOACCEL_TEST_BATCH_SIZE_LIMIT"

type batchSizeReport struct {
	Size  int    `json:"size"`
	Calls []int  `json:"calls"`
	Out   string `json:"out"`
}

// TestFindExecutableBatchSizeMPI: under mpirun, process 0 with the machine's memory and process 1 with a
// limit that fits 256 examples refuse 4096 together, both train at 256, and the main process says so once.
func TestFindExecutableBatchSizeMPI(t *testing.T) {
	if mpitest.IsRank() {
		mpitest.Do(t, keepingMPI(func(*backends.Communicator) (any, error) {
			var limit int64
			if l, err := strconv.ParseInt(os.Getenv(batchSizeLimitEnv), 10, 64); err == nil && mpiRankOf() == 1 {
				limit = l
			}
			var out bytes.Buffer
			acc, err := accel.New(accel.WithBackend("go"), accel.WithMemoryLimit(limit), accel.WithOutput(&out))
			if err != nil {
				return nil, err
			}
			defer acc.Close()
			var rep batchSizeReport
			rep.Size, err = accel.FindExecutableBatchSize(acc, searchStart, trainAt(acc, &rep.Calls))
			rep.Out = out.String()
			return rep, err
		}))
		return
	}
	limit := limitFor(estimateAt(t), 256)
	results := mpitest.Run(t, 2, t.Name(), mpitest.WithEnv(batchSizeLimitEnv+"="+strconv.FormatInt(limit, 10)),
		mpitest.WithTimeout(2*time.Minute))
	reports := make([]batchSizeReport, 2)
	for r, res := range results {
		require.NoError(t, res.Decode(&reports[r]))
		assert.Equal(t, 256, reports[r].Size, "process %d", r)
		assert.Equal(t, []int{searchStart, 256}, reports[r].Calls, "process %d: both refused 4096 together", r)
	}
	assert.Equal(t, "goaccel: batch size 256 per process fits (refused for memory: 4096; skipped by the memory "+
		"estimate: 2048, 1024, 512)\n", reports[0].Out)
	assert.Empty(t, reports[1].Out, "one line, from the main process")
}

// mpiRankOf is this process's rank as mpirun's environment gives it.
func mpiRankOf() int {
	topo, err := backends.DetectTopology()
	if err != nil {
		return -1
	}
	return topo.Rank
}
