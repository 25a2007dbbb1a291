package cpuprofile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/examples/internal/cpuprofile"
)

func TestStart(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name        string
		path        string
		rank, world int
		wantFile    string
	}{
		{"none", "", 0, 1, ""},
		{"one process", filepath.Join(dir, "one.prof"), 0, 1, "one.prof"},
		{"rank of several", filepath.Join(dir, "job.prof"), 1, 2, "job.prof.rank-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stop, err := cpuprofile.Start(tt.path, tt.rank, tt.world)
			require.NoError(t, err)
			require.NoError(t, stop())
			if tt.wantFile == "" {
				return
			}
			info, err := os.Stat(filepath.Join(dir, tt.wantFile))
			require.NoError(t, err)
			assert.Positive(t, info.Size(), "an empty profile")
		})
	}
	_, err := cpuprofile.Start(filepath.Join(dir, "missing", "x.prof"), 0, 1)
	assert.Error(t, err)
}
