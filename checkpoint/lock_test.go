package checkpoint

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLockIsExclusive: a second Acquire of a held directory fails naming the holder; after Release it
// succeeds.
func TestLockIsExclusive(t *testing.T) {
	root := filepath.Join(t.TempDir(), "ckpt")
	first, err := Acquire(root)
	require.NoError(t, err)
	_, err = Acquire(root)
	var held *HeldError
	require.ErrorAs(t, err, &held)
	assert.Equal(t, root, held.Root)
	assert.Contains(t, err.Error(), "pid "+strconv.Itoa(os.Getpid()))
	assert.Contains(t, err.Error(), "give each job its own checkpoint directory")
	require.NoError(t, first.Release())
	second, err := Acquire(root)
	require.NoError(t, err)
	require.NoError(t, second.Release())
	require.NoError(t, second.Release(), "releasing twice is harmless")
}

// TestLockUnusableDirectory: a path that cannot hold checkpoints is refused by Acquire with the path.
func TestLockUnusableDirectory(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))
	loop := filepath.Join(dir, "loop")
	require.NoError(t, os.Symlink(loop, loop))
	for _, tc := range []struct{ name, root string }{
		{"a file", file},
		{"under a file", filepath.Join(file, "ckpt")},
		{"a symlink loop", loop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Acquire(tc.root)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.root+" cannot hold checkpoints")
		})
	}
}

// lockHolderEnv makes this test binary a process that takes a lock and waits to be killed.
const lockHolderEnv = "GOACCEL_CHECKPOINT_LOCK_HOLDER"

func TestMain(m *testing.M) {
	if root := os.Getenv(lockHolderEnv); root != "" {
		if _, err := Acquire(root); err != nil {
			os.Exit(3)
		}
		_, _ = os.Stdout.WriteString("held\n")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestLockOfKilledJobIsFree: a job killed with SIGKILL holds nothing: the next job takes the directory
// although the lock file (naming the dead job) is still there.
func TestLockOfKilledJobIsFree(t *testing.T) {
	root := filepath.Join(t.TempDir(), "ckpt")
	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), lockHolderEnv+"="+root)
	stdout, err := holder.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, holder.Start())
	buf := make([]byte, 5)
	_, err = stdout.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "held\n", string(buf))

	_, err = Acquire(root)
	var held *HeldError
	require.ErrorAs(t, err, &held, "the live holder keeps the directory")
	assert.Contains(t, held.Holder, "pid "+strconv.Itoa(holder.Process.Pid))

	require.NoError(t, holder.Process.Kill())
	_ = holder.Wait()
	content, err := os.ReadFile(filepath.Join(root, LockFile))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(content), "pid "+strconv.Itoa(holder.Process.Pid)), "the stale file stays")
	lock, err := Acquire(root)
	require.NoError(t, err, "a dead job's lock must not block")
	require.NoError(t, lock.Release())
}
