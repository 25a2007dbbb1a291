package launch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOutputSortsTaggedLines: ranks' stdout passes through, each distinct error once (the same words from
// several ranks, own rank numbers included, are one), mpirun's banners that restate the failure are
// dropped while others pass, and the logs keep everything.
func TestOutputSortsTaggedLines(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr strings.Builder
	out, err := NewOutput(dir, &stdout, &stderr)
	require.NoError(t, err)
	job := strings.Join([]string{
		"[1,0]<stdout>:epoch 1/3",
		"[1,1]<stderr>:demo: rank 1 of 2: bad label 9",
		"[1,0]<stderr>:demo: rank 0 of 2: bad label 9",
		"[1,1]<stderr>:warning: slow disk",
		"--------------------------------------------------------------------------",
		"MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD",
		"with errorcode 1.",
		"--------------------------------------------------------------------------",
		"[vm:09375] 2 more processes have sent help message help-mpi-api.txt / mpi-abort",
		"--------------------------------------------------------------------------",
		"A note mpirun has for you",
		"--------------------------------------------------------------------------",
		"",
	}, "\n")
	// Written in pieces that split lines, as pipes do.
	w := out.Stderr()
	for i := 0; i < len(job); i += 7 {
		_, err := w.Write([]byte(job[i:min(i+7, len(job))]))
		require.NoError(t, err)
	}
	require.NoError(t, out.Close())

	assert.Equal(t, "epoch 1/3\n", stdout.String())
	terminal := stderr.String()
	assert.Equal(t, 1, strings.Count(terminal, "bad label 9"), terminal)
	assert.Contains(t, terminal, "rank 1: demo: rank 1 of 2: bad label 9")
	assert.Contains(t, terminal, "rank 1: warning: slow disk")
	assert.Contains(t, terminal, "A note mpirun has for you", "banners that explain something new pass")
	assert.NotContains(t, terminal, "MPI_ABORT")
	assert.NotContains(t, terminal, "help message")
	assert.Equal(t, "  ranks 0-1: demo: rank N of 2: bad label 9\n  rank 1: warning: slow disk\n"+
		"  (every rank's whole output: "+filepath.Join(dir, "rank-N.log")+")\n", out.Summary())

	rank0, err := os.ReadFile(filepath.Join(dir, "rank-0.log"))
	require.NoError(t, err)
	assert.Equal(t, "stdout: epoch 1/3\nstderr: demo: rank 0 of 2: bad label 9\n", string(rank0))
	mpirun, err := os.ReadFile(filepath.Join(dir, "mpirun.log"))
	require.NoError(t, err)
	assert.Contains(t, string(mpirun), "MPI_ABORT was invoked", "the logs keep what the terminal was spared")
}

func TestRankList(t *testing.T) {
	for _, tc := range []struct {
		ranks []int
		want  string
	}{
		{[]int{2}, "rank 2"}, {[]int{3, 0, 1, 2}, "ranks 0-3"}, {[]int{0, 1, 3, 5, 6}, "ranks 0-1, 3, 5-6"}, {[]int{1, 1}, "rank 1"},
	} {
		assert.Equal(t, tc.want, rankList(tc.ranks))
	}
}
