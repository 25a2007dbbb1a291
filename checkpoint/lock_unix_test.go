//go:build unix

package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLockRefusesWhatIsNotARegularFile: a lock path that is a symlink (to a file, to nothing, to a
// directory), a directory or a named pipe is refused with what it is, and the file a symlink points at is
// left exactly as it was: a planted DIR/.lock -> victim must not have the job truncate the victim and
// write its pid into it.
func TestLockRefusesWhatIsNotARegularFile(t *testing.T) {
	const victimText = "precious data\n"
	tests := []struct {
		name    string
		plant   func(t *testing.T, lock, victim string)
		wantErr string
	}{
		{"a symlink to a file", func(t *testing.T, lock, victim string) {
			require.NoError(t, os.Symlink(victim, lock))
		}, " is a symlink to VICTIM; a checkpoint directory's lock must be a regular file"},
		{"a symlink to nothing", func(t *testing.T, lock, victim string) {
			require.NoError(t, os.Symlink(victim+".new", lock))
		}, " is a symlink to VICTIM.new; a checkpoint directory's lock must be a regular file"},
		{"a relative symlink", func(t *testing.T, lock, victim string) {
			require.NoError(t, os.Symlink(filepath.Join("..", filepath.Base(victim)), lock))
		}, " is a symlink to ../victim.txt; a checkpoint directory's lock must be a regular file"},
		{"a symlink to a directory", func(t *testing.T, lock, victim string) {
			require.NoError(t, os.Symlink(filepath.Dir(victim), lock))
		}, " is a symlink to "},
		{"a directory", func(t *testing.T, lock, victim string) {
			require.NoError(t, os.Mkdir(lock, 0o755))
		}, " is a directory; a checkpoint directory's lock must be a regular file"},
		{"a named pipe", func(t *testing.T, lock, victim string) {
			if err := syscall.Mkfifo(lock, 0o644); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
		}, " is a named pipe; a checkpoint directory's lock must be a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			victim := filepath.Join(dir, "victim.txt")
			require.NoError(t, os.WriteFile(victim, []byte(victimText), 0o600))
			root := filepath.Join(dir, "ckpt")
			require.NoError(t, os.Mkdir(root, 0o755))
			lockPath := filepath.Join(root, LockFile)
			tt.plant(t, lockPath, victim)

			lock, err := Acquire(root)
			if lock != nil {
				_ = lock.Release()
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "checkpoint: "+lockPath+strings.ReplaceAll(tt.wantErr, "VICTIM", victim))
			content, err := os.ReadFile(victim)
			require.NoError(t, err)
			assert.Equal(t, victimText, string(content), "the symlink's target was written to")
			assert.NoFileExists(t, victim+".new", "the dangling symlink's target was created")
		})
	}
}

// TestLockOpenRefusesSymlink: the open itself does not follow a symlink, so that one planted between
// Acquire's check and its open is refused too.
func TestLockOpenRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim.txt")
	require.NoError(t, os.WriteFile(victim, []byte("precious"), 0o600))
	lockPath := filepath.Join(dir, LockFile)
	require.NoError(t, os.Symlink(victim, lockPath))
	f, err := openLockFile(lockPath)
	if f != nil {
		_ = f.Close()
	}
	require.Error(t, err)
	assert.ErrorIs(t, err, syscall.ELOOP)
}
