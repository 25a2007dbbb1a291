package enginetest_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gomlx/gomlx/pkg/core/dtypes/bfloat16"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/backends/enginetest"
)

// checkAll runs Check on every rank of a group concurrently, one goroutine per rank, as ranks would.
func checkAll(comms []*backends.Communicator, opts ...enginetest.Option) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for rank, comm := range comms {
		wg.Go(func() { errs[rank] = enginetest.Check(comm, opts...) })
	}
	wg.Wait()
	return errs
}

func TestCheckPassesOnShippedEngines(t *testing.T) {
	inProcess := func(n int) func(t *testing.T) []*backends.Communicator {
		return func(t *testing.T) []*backends.Communicator {
			comms, err := backends.NewInProcessGroup(n, backends.WithTimeout(30*time.Second))
			require.NoError(t, err)
			return comms
		}
	}
	tests := []struct {
		name  string
		group func(t *testing.T) []*backends.Communicator
	}{
		{"single/NewSingle", func(*testing.T) []*backends.Communicator {
			return []*backends.Communicator{backends.NewSingle()}
		}},
		{"single/Open", func(t *testing.T) []*backends.Communicator {
			topo, err := backends.DetectTopology()
			require.NoError(t, err)
			require.Equal(t, 1, topo.WorldSize, "run this test outside a launcher")
			comm, err := backends.Open("single", topo)
			require.NoError(t, err)
			return []*backends.Communicator{comm}
		}},
		{"inprocess/1", inProcess(1)},
		{"inprocess/2", inProcess(2)},
		{"inprocess/3", inProcess(3)},
		{"inprocess/4", inProcess(4)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			comms := tt.group(t)
			for rank, err := range checkAll(comms) {
				assert.NoError(t, err, "rank %d", rank)
			}
			// Check is repeatable on the same communicators: it checks counter deltas, not totals.
			for rank, err := range checkAll(comms, enginetest.WithLargeLen(1000)) {
				assert.NoError(t, err, "second run, rank %d", rank)
			}
			for _, c := range comms {
				require.NoError(t, c.Close())
			}
		})
	}
}

// faultyEngine wraps the single-rank engine and breaks one promise, to show Check notices.
type faultyEngine struct {
	backends.Engine
	fault string
}

type pendingForever struct{}

func (pendingForever) Test() (bool, error) { return false, nil }

func (e faultyEngine) StartAllReduceSum(buf backends.Buffer) (backends.Request, error) {
	switch e.fault {
	case "phantom rank":
		// Sums in a rank that is not there: float32 buffers come back doubled.
		if buf.Kind == backends.Float32 {
			b := backends.View[float32](buf)
			for i := range b {
				b[i] *= 2
			}
		}
	case "saturating uint8":
		// Open MPI 4.1's AVX kernels: uint8 sums clamp at 255 on long buffers instead of wrapping. With one
		// rank nothing overflows, so this fault clamps what would overflow with a second copy.
		if b := buf; b.Kind == backends.Uint8 && b.Len >= 64 {
			b := backends.View[uint8](b)
			for i := range b {
				if int(b[i])*2 > 255 {
					b[i] = 255
				}
			}
		}
	case "16-bit floats one ulp off":
		// A sum that converts or rounds 16-bit floats wrongly: every value moves to its neighbour.
		if buf.Kind == backends.BFloat16 {
			b := backends.View[bfloat16.BFloat16](buf)
			for i := range b {
				b[i]++
			}
		}
	case "hangs":
		return pendingForever{}, nil
	case "fails":
		return nil, errors.New("link down")
	}
	return e.Engine.StartAllReduceSum(buf)
}

func (e faultyEngine) StartBroadcast(buf backends.Buffer, root int) (backends.Request, error) {
	if e.fault == "broadcast scribbles" && buf.Kind == backends.Int64 && buf.Len > 0 {
		b := backends.View[int64](buf)
		b[len(b)-1]++
	}
	return e.Engine.StartBroadcast(buf, root)
}

func (e faultyEngine) StartReduceScatterSum(send, recv backends.Buffer) (backends.Request, error) {
	if e.fault == "scatter drops the tail" && recv.Len > 1 {
		// Delivers all but the last element of the block.
		req, err := e.Engine.StartReduceScatterSum(send.Slice(0, send.Len-1), recv.Slice(0, recv.Len-1))
		return req, err
	}
	return e.Engine.StartReduceScatterSum(send, recv)
}

func (e faultyEngine) StartAllGather(send, recv backends.Buffer) (backends.Request, error) {
	if e.fault == "gather ignores recv" {
		return e.Engine.StartBarrier()
	}
	return e.Engine.StartAllGather(send, recv)
}

func TestCheckCatchesFaultyEngines(t *testing.T) {
	tests := []struct {
		fault   string
		wantErr string
	}{
		{"phantom rank", "all-reduce float32[1]: element 0 is 2, want 1"},
		{"saturating uint8", "all-reduce uint8[1048576]: element 0 is 255, want 200"},
		{"16-bit floats one ulp off", "all-reduce bfloat16[1]: element 0 is 8.951173e-16, want 8.881784e-16"},
		{"broadcast scribbles", "broadcast int64[260] from root 0: element 259"},
		{"gather ignores recv", "all-gather float32[5]: element 0"},
		{"scatter drops the tail", "reduce-scatter float32[7]: element 6"},
		{"hangs", "all-reduce of 0 bytes) did not complete within 100ms"},
		{"fails", "starting all-reduce: link down"},
	}
	for _, tt := range tests {
		t.Run(tt.fault, func(t *testing.T) {
			single, err := backends.OpenEngine("single", backends.Topology{Rank: 0, WorldSize: 1, LocalSize: 1, Nodes: 1})
			require.NoError(t, err)
			comm := backends.NewCommunicator("faulty", faultyEngine{Engine: single, fault: tt.fault},
				backends.WithTimeout(100*time.Millisecond))
			err = enginetest.Check(comm)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.Contains(t, err.Error(), `engine "faulty"`)
		})
	}
}

func TestCheckRejectsNegativeLargeLen(t *testing.T) {
	err := enginetest.Check(backends.NewSingle(), enginetest.WithLargeLen(-1))
	require.ErrorContains(t, err, "negative")
}

// Engine authors run Check on every rank of their group at once and expect nil everywhere.
func ExampleCheck() {
	comms, err := backends.NewInProcessGroup(3)
	if err != nil {
		panic(err)
	}
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for rank, comm := range comms {
		wg.Go(func() { errs[rank] = enginetest.Check(comm, enginetest.WithLargeLen(1<<10)) })
	}
	wg.Wait()
	fmt.Println(errors.Join(errs...) == nil)
	// Output: true
}
