package launch

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOutputReadsRankAnnouncements: the processes' announcements go to their logs and ranks.txt, not to
// the terminal; once every process of a run announced itself, OnRanks gets them in rank order, once, and
// again for a restarted job's new run.
func TestOutputReadsRankAnnouncements(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr strings.Builder
	out, err := NewOutput(dir, &stdout, &stderr)
	require.NoError(t, err)
	var told [][]RankProcess
	out.OnRanks(func(procs []RankProcess, file string) {
		assert.Equal(t, filepath.Join(dir, RanksFile), file)
		told = append(told, procs)
	})
	write := func(lines ...string) {
		_, err := out.Stderr().Write([]byte(strings.Join(lines, "\n") + "\n"))
		require.NoError(t, err)
	}
	write("[1,1]<stderr>:goaccel-rank: rank=1 size=3 host=node2 pid=8702",
		"[1,0]<stderr>:goaccel-rank: rank=0 size=3 host=node1 pid=8682",
		"[1,0]<stdout>:epoch 1")
	assert.Empty(t, told, "rank 2 has not announced itself")
	ranks, err := os.ReadFile(filepath.Join(dir, RanksFile))
	require.NoError(t, err)
	assert.Equal(t, "# rank host pid\n0 node1 8682\n1 node2 8702\n", string(ranks), "what came so far")
	// Rank 2's words, then a line of rank 0 that only looks like an announcement of another rank.
	write("[1,2]<stderr>:goaccel-rank: rank=2 size=3 host=node2 pid=8703",
		"[1,0]<stderr>:goaccel-rank: rank=5 size=9 host=x pid=1")
	want := []RankProcess{{0, 3, "node1", 8682}, {1, 3, "node2", 8702}, {2, 3, "node2", 8703}}
	assert.Equal(t, [][]RankProcess{want}, told)
	assert.Equal(t, "  rank 0  node1  PID 8682\n  rank 1  node2  PID 8702\n  rank 2  node2  PID 8703\n", RankTable(want))
	ranks, err = os.ReadFile(filepath.Join(dir, RanksFile))
	require.NoError(t, err)
	assert.Equal(t, "# rank host pid\n0 node1 8682\n1 node2 8702\n2 node2 8703\n", string(ranks))

	out.Restarted()
	write("[2,0]<stderr>:goaccel-rank: rank=0 size=3 host=node1 pid=9001",
		"[2,2]<stderr>:goaccel-rank: rank=2 size=3 host=node2 pid=9003",
		"[2,1]<stderr>:goaccel-rank: rank=1 size=3 host=node2 pid=9002")
	require.Len(t, told, 2, "the restarted run's processes")
	assert.Equal(t, []RankProcess{{0, 3, "node1", 9001}, {1, 3, "node2", 9002}, {2, 3, "node2", 9003}}, told[1])
	require.NoError(t, out.Close())

	assert.Equal(t, "epoch 1\n", stdout.String())
	assert.Equal(t, "rank 0: goaccel-rank: rank=5 size=9 host=x pid=1\n", stderr.String(), "only the line that is no announcement")
	log, err := os.ReadFile(filepath.Join(dir, "rank-1.log"))
	require.NoError(t, err)
	assert.Equal(t, "stderr: goaccel-rank: rank=1 size=3 host=node2 pid=8702\nstderr: goaccel-rank: rank=1 size=3 host=node2 pid=9002\n",
		string(log))
}

// TestArgvAnnouncesRanks: WithRankAnnouncements runs the program through /bin/sh, which announces the
// process and execs the program with its arguments; Open MPI only, and not a program whose name starts
// with '-', which the shell's exec would read as an option.
func TestArgvAnnouncesRanks(t *testing.T) {
	base := []Option{WithRunAsRoot(false), WithCPUs(2), WithEnviron([]string{}), WithRankAnnouncements()}
	argv, err := Argv(2, "./train", []string{"-epochs", "3"}, append(base, WithFlavor(OpenMPI))...)
	require.NoError(t, err)
	assert.Equal(t, []string{"mpirun", "-np", "2", "--bind-to", "none", "/bin/sh", "-c", announceScript, "goaccel-rank",
		"./train", "-epochs", "3"}, argv)
	argv, err = Argv(2, "-train", nil, append(base, WithFlavor(OpenMPI))...)
	require.NoError(t, err)
	assert.Equal(t, []string{"mpirun", "-np", "2", "--bind-to", "none", "-train"}, argv)
	argv, err = Argv(2, "./train", nil, append(base, WithFlavor(MPICH))...)
	require.NoError(t, err)
	assert.Equal(t, []string{"mpirun", "-np", "2", "./train"}, argv)
}
