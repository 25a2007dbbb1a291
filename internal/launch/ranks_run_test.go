package launch_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/testing/mpitest"
)

// TestRunAnnouncesRanks: under a real mpirun, each process's announcement names its rank, this host and
// the PID the program itself has (the shell execs it), and the program gets its arguments unchanged.
func TestRunAnnouncesRanks(t *testing.T) {
	mpitest.RequireMPIRun(t)
	logs, pids := t.TempDir(), t.TempDir()
	out, err := launch.NewOutput(logs, &bytes.Buffer{}, &bytes.Buffer{})
	require.NoError(t, err)
	var told []launch.RankProcess
	out.OnRanks(func(procs []launch.RankProcess, _ string) { told = procs })
	code, err := launch.Run(context.Background(), 2, "sh", []string{"-c", `echo "$$" > "$0/pid-$OMPI_COMM_WORLD_RANK"`, pids},
		launch.WithTaggedOutput(), launch.WithRankAnnouncements(), launch.WithStdio(nil, out.Stdout(), out.Stderr()))
	require.NoError(t, out.Close())
	require.NoError(t, err)
	require.Equal(t, 0, code)
	host, err := os.Hostname()
	require.NoError(t, err)
	require.Len(t, told, 2)
	for rank, p := range told {
		data, err := os.ReadFile(filepath.Join(pids, fmt.Sprintf("pid-%d", rank)))
		require.NoError(t, err)
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		require.NoError(t, err)
		assert.Equal(t, launch.RankProcess{Rank: rank, Size: 2, Host: host, PID: pid}, p)
	}
}
