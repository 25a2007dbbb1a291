package heap

import (
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSettleEmptiesPools checks the reason for collecting twice: large buffers parked in a sync.Pool are
// still live after one collection and freed by Settle. (Eight of them: under the race detector Put drops
// a quarter of what it is given, at random.)
func TestSettleEmptiesPools(t *testing.T) {
	const buffers, each = 8, 8 << 20
	const size = buffers * each
	var pool sync.Pool
	inUse := func() uint64 {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	Settle()
	base := inUse()
	// Made first, then parked: making them may start collections, which must not find any in the pool.
	made := make([][]byte, buffers)
	for i := range made {
		made[i] = make([]byte, each)
	}
	for i := range made {
		pool.Put(made[i])
		made[i] = nil
	}
	runtime.GC()
	require.Greater(t, inUse(), base+size/4, "one collection leaves a pooled buffer in the victim cache")
	Settle()
	require.Less(t, inUse(), base+each, "Settle frees them")
}
