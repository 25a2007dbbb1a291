package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
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
// permission to write): both are found when a job starts, not when it first saves. The lock file must be a
// regular file: a symlink, directory or device in its place is refused, never followed or written to. Release the lock when
// the job ends; the kernel releases it if the process dies first.
func Acquire(root string) (*Lock, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, unusableRoot(root, err)
	}
	path := filepath.Join(root, LockFile)
	if err := checkLockPath(path); err != nil {
		return nil, err
	}
	f, err := openLockFile(path)
	if err != nil {
		// A symlink or other file put in place since checkLockPath looked is named as it would have been.
		if lerr := checkLockPath(path); lerr != nil {
			return nil, lerr
		}
		return nil, fmt.Errorf("checkpoint: %s cannot hold checkpoints: %w", root, err)
	}
	// What was opened, not what the name pointed at a moment before, must be a regular file.
	if info, err := f.Stat(); err != nil || !info.Mode().IsRegular() {
		_ = f.Close()
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %s cannot hold checkpoints: %w", root, err)
		}
		return nil, fmt.Errorf("checkpoint: %s is %s; a checkpoint directory's lock must be a regular file", path,
			describeMode(info.Mode()))
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
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(holder+"\n"), 0)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("checkpoint: %s cannot hold checkpoints: %w", root, err)
	}
	return &Lock{root: root, file: f}, nil
}

// checkLockPath refuses a lock path that exists and is not a regular file: a symlink planted there would
// have the job truncate and write to the file it points at (whatever the holder may write), a directory or
// a device cannot hold a lock.
func checkLockPath(path string) error {
	info, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) || err == nil && info.Mode().IsRegular() {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checkpoint: %s cannot hold checkpoints: %w", filepath.Dir(path), err)
	}
	what := describeMode(info.Mode())
	if info.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(path)
		if err != nil {
			target = "an unreadable target"
		}
		what = "a symlink to " + target
	}
	return fmt.Errorf("checkpoint: %s is %s; a checkpoint directory's lock must be a regular file", path, what)
}

// describeMode names a file's type: "a directory", "a named pipe", ...
func describeMode(mode fs.FileMode) string {
	switch {
	case mode.IsDir():
		return "a directory"
	case mode&fs.ModeSymlink != 0:
		return "a symlink"
	case mode&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case mode&fs.ModeSocket != 0:
		return "a socket"
	case mode&fs.ModeCharDevice != 0:
		return "a character device"
	case mode&fs.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file"
}

// unusableRoot is the error for a root that MkdirAll could not create. A symlink that cannot be followed,
// as root or on the way to it, makes MkdirAll say only "file exists": the error says what it is instead.
func unusableRoot(root string, err error) error {
	if link, what := brokenSymlink(root); link != "" {
		return fmt.Errorf("checkpoint: %s cannot hold checkpoints: %s is %s", root, link, what)
	}
	return fmt.Errorf("checkpoint: %s cannot hold checkpoints: %w", root, err)
}

// maxSymlinkHops bounds how far brokenSymlink follows a chain of symlinks, as the kernel does (40 on Linux).
const maxSymlinkHops = 40

// brokenSymlink finds, from path up to its root, the first symlink that cannot be followed, and says what
// it is: "a symlink loop (x → y → x)", "a dangling symlink to t, which does not exist", or a symlink to a
// target that cannot be read. It returns "" when there is none.
func brokenSymlink(path string) (link, what string) {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if info, err := os.Lstat(p); err == nil && info.Mode()&fs.ModeSymlink != 0 {
			if _, err := os.Stat(p); err != nil {
				return p, describeBrokenSymlink(p, err)
			}
		}
		if parent := filepath.Dir(p); parent == p {
			return "", ""
		}
	}
}

// describeBrokenSymlink follows the symlink at link, whose os.Stat failed with err, to say why.
func describeBrokenSymlink(link string, err error) string {
	chain := []string{link}
	seen := map[string]bool{link: true}
	for p := link; len(chain) <= maxSymlinkHops; {
		target, rerr := os.Readlink(p)
		if rerr != nil {
			break
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		target = filepath.Clean(target)
		chain = append(chain, target)
		if seen[target] {
			return fmt.Sprintf("a symlink loop (%s)", strings.Join(chain, " → "))
		}
		seen[target] = true
		info, lerr := os.Lstat(target)
		switch {
		case errors.Is(lerr, fs.ErrNotExist):
			if len(chain) == 2 {
				return fmt.Sprintf("a dangling symlink to %s, which does not exist", target)
			}
			return fmt.Sprintf("a dangling symlink (%s, which does not exist)", strings.Join(chain, " → "))
		case lerr != nil || info.Mode()&fs.ModeSymlink == 0:
			// A target that exists but cannot be followed: a loop through a directory on its path, or no
			// permission.
			return fmt.Sprintf("a symlink that cannot be followed (%s): %v", strings.Join(chain, " → "), err)
		}
		p = target
	}
	if len(chain) > maxSymlinkHops {
		return fmt.Sprintf("a chain of more than %d symlinks (%s → …)", maxSymlinkHops, strings.Join(chain[:3], " → "))
	}
	return fmt.Sprintf("a symlink that cannot be followed: %v", err)
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
