// Package cpuprofile writes a CPU profile of one phase of an example program (its training loop), for
// `go tool pprof`, the way the examples' -cpuprofile flag asks.
package cpuprofile

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// Start starts a CPU profile written to path, or does nothing when path is empty; stop ends it and closes
// the file. On several processes each profiles itself, into path + ".rank-N".
func Start(path string, rank, worldSize int) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	if worldSize > 1 {
		path = fmt.Sprintf("%s.rank-%d", path, rank)
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}
