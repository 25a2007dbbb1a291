//go:build !unix

package checkpoint

import "os"

// openLockFile opens (creating it) the lock file at path. This platform has no O_NOFOLLOW: Acquire's check
// before the open, and of the opened file after it, refuse what is not a regular file.
func openLockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
}

// lockExclusive cannot lock without flock: Acquire still checks that the directory is writable, but two
// jobs sharing one directory are not detected on this platform.
func lockExclusive(*os.File) error { return nil }
