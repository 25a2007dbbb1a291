package checkpoint

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBrokenSymlinkRootIsNamed: a checkpoint directory that is a symlink loop or a dangling symlink, or lies
// under one, is refused by Acquire and Write with what it is, not MkdirAll's "file exists".
func TestBrokenSymlinkRootIsNamed(t *testing.T) {
	dir := t.TempDir()
	loop := filepath.Join(dir, "loop")
	require.NoError(t, os.Symlink(loop, loop))
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	require.NoError(t, os.Symlink("b", a))
	require.NoError(t, os.Symlink("a", b))
	dangling := filepath.Join(dir, "dangling")
	missing := filepath.Join(dir, "no-such-dir")
	require.NoError(t, os.Symlink(missing, dangling))
	chain := filepath.Join(dir, "chain")
	require.NoError(t, os.Symlink("dangling", chain))
	for _, tc := range []struct{ name, root, want string }{
		{"a symlink to itself", loop, loop + " is a symlink loop (" + loop + " → " + loop + ")"},
		{"two symlinks to each other", a, a + " is a symlink loop (" + a + " → " + b + " → " + a + ")"},
		{"under a symlink loop", filepath.Join(loop, "ckpt"), loop + " is a symlink loop"},
		{"a dangling symlink", dangling, dangling + " is a dangling symlink to " + missing + ", which does not exist"},
		{"a chain to a dangling symlink", chain, chain + " is a dangling symlink (" + chain + " → " + dangling + " → " +
			missing + ", which does not exist)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Acquire(tc.root)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.root+" cannot hold checkpoints: "+tc.want)
			assert.NotContains(t, err.Error(), "file exists")
			_, err = Write(tc.root, 0, func(string) error { return nil })
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.root+" cannot hold checkpoints: "+tc.want)
		})
	}
	// Other failures keep MkdirAll's own words.
	file := filepath.Join(dir, "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err := Acquire(filepath.Join(file, "ckpt"))
	assert.ErrorContains(t, err, "not a directory")
}
