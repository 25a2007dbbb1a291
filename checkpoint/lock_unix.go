//go:build unix

package checkpoint

import (
	"errors"
	"os"
	"syscall"
)

// lockExclusive takes an flock on f without waiting: errHeld when another open file of it holds one.
func lockExclusive(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errHeld
	}
	return err
}
