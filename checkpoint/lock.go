package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// errHeld is lockExclusive's error when another open file holds the lock.
var errHeld = errors.New("held by another job")

// LockFile is the file in a checkpoint directory whose lock marks the directory as one job's.
const LockFile = ".lock"

// Lock is one job's exclusive hold on a checkpoint directory: while it is held, another job's Acquire of
// the same directory fails instead of deleting this job's temporary checkpoint and interleaving numbers
// with it. The hold is an flock on LockFile, so the kernel drops it when the holding process ends, however
// it ends: a lock file left by a dead job does not block the next one.
type Lock struct {
	root string
	file *os.File
}

// HeldError is Acquire's error for a directory another job holds.
type HeldError struct {
	Root   string
	Holder string // what the holder wrote: its pid, host and start time (may be empty)
}

func (e *HeldError) Error() string {
	holder := e.Holder
	if holder == "" {
		holder = "a job that has not said who it is yet"
	}
	return fmt.Sprintf("checkpoint: %s is in use by another job (%s): give each job its own checkpoint directory",
		e.Root, holder)
}

// Acquire creates root if needed and takes it for this job. It fails with a *HeldError when another job
// holds root, and with an error naming root when root cannot hold checkpoints (a file, a symlink loop, no
// permission to write): both are found when a job starts, not when it first saves. Release the lock when
// the job ends; the kernel releases it if the process dies first.
func Acquire(root string) (*Lock, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: %s cannot hold checkpoints: %w", root, err)
	}
	path := filepath.Join(root, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s cannot hold checkpoints: %w", root, err)
	}
	if err := lockExclusive(f); err != nil {
		holder, _ := os.ReadFile(path)
		_ = f.Close()
		if errors.Is(err, errHeld) {
			return nil, &HeldError{Root: root, Holder: strings.TrimSpace(string(holder))}
		}
		return nil, fmt.Errorf("checkpoint: locking %s: %w", path, err)
	}
	host, _ := os.Hostname()
	holder := fmt.Sprintf("pid %d on %s, since %s", os.Getpid(), host, time.Now().UTC().Format(time.RFC3339))
	// Writing the holder also proves the directory is writable.
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(holder+"\n"), 0)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("checkpoint: %s cannot hold checkpoints: %w", root, err)
	}
	return &Lock{root: root, file: f}, nil
}

// Root is the directory the lock holds.
func (l *Lock) Root() string { return l.root }

// Release gives the directory back. The lock file stays: its content only describes the last holder.
func (l *Lock) Release() error {
	if l == nil || l.file == nil {
		return nil
	}
	err := l.file.Close() // closing the only descriptor drops the flock
	l.file = nil
	return err
}
