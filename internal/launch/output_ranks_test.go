package launch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sortOutput passes job's lines through a new Output and returns the terminal's stderr, the summary and the
// directory of the logs.
func sortOutput(t *testing.T, job ...string) (terminal, summary, dir string) {
	t.Helper()
	dir = t.TempDir()
	var stdout, stderr strings.Builder
	out, err := NewOutput(dir, &stdout, &stderr)
	require.NoError(t, err)
	_, err = out.Stderr().Write([]byte(strings.Join(job, "\n") + "\n"))
	require.NoError(t, err)
	require.NoError(t, out.Close())
	return stderr.String(), out.Summary(), dir
}

// TestOutputRewritesOnlyTheRankPrefix: the rank number that the summary writes as N, to group the same
// message from every rank, is only the one in the line's rank prefix ("demo: rank 1 of 2: ", "rank 1: ");
// rank numbers inside the message ("backends: rank 1: collective #1", "rank 0 failed", "(rank 1 stopped
// waiting…)") are facts, kept on the terminal and in the summary, and a line only one rank wrote is shown
// in its own words.
func TestOutputRewritesOnlyTheRankPrefix(t *testing.T) {
	terminal, summary, _ := sortOutput(t,
		"[1,0]<stderr>:demo: rank 0 of 2: backends: rank 0: collective #1 (barrier of 0 bytes) did not complete within 1s",
		"[1,1]<stderr>:demo: rank 1 of 2: backends: rank 1: collective #1 (barrier of 0 bytes) did not complete within 1s",
		"[1,1]<stderr>:demo: rank 1 of 2: backends: rank 0 failed: boom (rank 1 stopped waiting for it in barrier)",
		"[1,0]<stderr>:rank 0: done",
		"[1,1]<stderr>:rank 1: done",
	)
	for _, want := range []string{
		"rank 0: demo: rank 0 of 2: backends: rank 0: collective #1 (barrier of 0 bytes) did not complete within 1s\n",
		"rank 1: demo: rank 1 of 2: backends: rank 1: collective #1 (barrier of 0 bytes) did not complete within 1s\n",
		"rank 1: demo: rank 1 of 2: backends: rank 0 failed: boom (rank 1 stopped waiting for it in barrier)\n",
	} {
		assert.Contains(t, terminal, want)
		assert.Contains(t, summary, "  "+want, "the summary")
	}
	assert.Contains(t, terminal, "rank 0: rank 0: done\n")
	assert.NotContains(t, terminal, "rank N")
	assert.Contains(t, summary, "  ranks 0-1: rank N: done\n", "the same words but for the rank prefix are one line")
	assert.Equal(t, 1, strings.Count(terminal, "done"), terminal)
}

// TestOutputSortsGoMLXBackendList: GoMLX lists its backends in an order that varies from process to
// process; the same error from every rank is still one line.
func TestOutputSortsGoMLXBackendList(t *testing.T) {
	const msg = `demo: rank %s of 2: accel: compute: backend "nope" (requested by GOMLX_BACKEND) failed to start: can't ` +
		`find backend "nope" for configuration "nope" given, backends available: %s`
	terminal, summary, _ := sortOutput(t,
		"[1,0]<stderr>:"+strings.ReplaceAll(strings.Replace(msg, "%s", "0", 1), "%s", `"go", "xla", "stablehlo"`),
		"[1,1]<stderr>:"+strings.ReplaceAll(strings.Replace(msg, "%s", "1", 1), "%s", `"xla", "stablehlo", "go"`),
	)
	assert.Equal(t, 1, strings.Count(terminal, "can't find backend"), terminal)
	assert.Equal(t, 1, strings.Count(summary, "can't find backend"), summary)
	assert.Contains(t, summary, `  ranks 0-1: demo: rank N of 2: accel: compute: backend "nope"`)
	assert.Contains(t, summary, `backends available: "go", "stablehlo", "xla"`)
}

// TestOutputDropsOpenMPINBCLines: Open MPI's libnbc lines about a failed collective, which no setting
// turns off and the rank's own error explains, stay in the rank's log and off the terminal and summary.
func TestOutputDropsOpenMPINBCLines(t *testing.T) {
	terminal, summary, dir := sortOutput(t,
		"[1,1]<stderr>:MPI Error in NBC subrequest 0x7f495c1a7b40 : 15",
		"[1,1]<stderr>:NBC_Progress: an error 15 was found during schedule 0x7f495c1b5010 at row-offset 0 - aborting the schedule",
		"[1,1]<stderr>:demo: rank 1 of 2: backends: collective #2 (all-gather of uint8[16]) failed on rank 1: MPI_ERR_TRUNCATE",
	)
	for _, nbc := range []string{"NBC subrequest", "NBC_Progress"} {
		assert.NotContains(t, terminal, nbc)
		assert.NotContains(t, summary, nbc)
	}
	assert.Contains(t, summary, "rank 1: demo: rank 1 of 2: backends: collective #2 (all-gather of uint8[16]) failed on rank 1")
	log, err := os.ReadFile(filepath.Join(dir, "rank-1.log"))
	require.NoError(t, err)
	assert.Contains(t, string(log), "stderr: MPI Error in NBC subrequest 0x7f495c1a7b40 : 15\n")
}
