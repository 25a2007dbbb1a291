package backends

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPollingFollowsCores: a wait spins between polls when every rank of the node has a core, yields the
// processor when ranks outnumber the cores, and yields to goroutines for the in-process engine, whose
// ranks are goroutines.
func TestPollingFollowsCores(t *testing.T) {
	for _, tc := range []struct {
		name      string
		localSize int
		want      pollMode
	}{
		{"a core per rank", 1, pollSpinning},
		{"as many ranks as cores", runtime.NumCPU(), pollSpinning},
		{"more ranks than cores", runtime.NumCPU() + 1, pollYieldingThreads},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Open("single", Topology{WorldSize: 1, LocalSize: tc.localSize, Nodes: 1})
			require.NoError(t, err)
			assert.Equal(t, tc.want, c.polling)
			require.NoError(t, c.Close())
		})
	}
	comms, err := NewInProcessGroup(2)
	require.NoError(t, err)
	for _, c := range comms {
		assert.Equal(t, pollYieldingGoroutines, c.polling)
		require.NoError(t, c.Close())
	}
}
