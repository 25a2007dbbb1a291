//go:build !linux

package launch

// singleCopyWorks: cross-memory attach is a Linux mechanism; elsewhere Open MPI does not try it.
func singleCopyWorks() (bool, string) { return true, "" }
