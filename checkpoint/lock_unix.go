//go:build unix

package checkpoint

import (
	"errors"
	"os"
	"syscall"
)

// openLockFile opens (creating it) the lock file at path without following a symlink there: one planted
// after Acquire's check fails to open (ELOOP) rather than sending the holder's words to its target.
// O_NONBLOCK keeps the open of a named pipe from waiting; Acquire refuses what is not a regular file.
func openLockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o644)
}

// lockExclusive takes an flock on f without waiting: errHeld when another open file of it holds one.
func lockExclusive(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errHeld
	}
	return err
}
