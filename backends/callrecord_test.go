package backends

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestCallRecordStringIsSafe: a call record from a peer can hold any bytes (a rank out of step, with
// another message in the buffer): describing it never panics.
func TestCallRecordStringIsSafe(t *testing.T) {
	records := []callRecord{
		{7975678474651933971, -1, 3, 0},
		{int64(OpBroadcast), -5, -1, -7},
		{int64(OpAllReduce), 1 << 40, 1 << 62, 0},
		{-1, 0, 0, 0},
		{int64(OpBarrier), 99, 99, 99},
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 1000 {
		records = append(records, callRecord{rng.Int64() - rng.Int64(), rng.Int64() - rng.Int64(), rng.Int64(), rng.Int64() - rng.Int64()})
	}
	for _, r := range records {
		assert.NotPanics(t, func() { _ = r.String() }, "%v", [4]int64(r))
		assert.NotContains(t, r.String(), "PANIC", "%v", [4]int64(r))
	}
	assert.Equal(t, "Op(7975678474651933971) of ElementKind(-1)[3]", records[0].String())
}
