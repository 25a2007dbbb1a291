//go:build !unix

package checkpoint

import "os"

// lockExclusive cannot lock without flock: Acquire still checks that the directory is writable, but two
// jobs sharing one directory are not detected on this platform.
func lockExclusive(*os.File) error { return nil }
