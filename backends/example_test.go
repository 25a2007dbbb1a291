package backends_test

import (
	"fmt"
	"sync"

	"github.com/gomlx/gomlx/pkg/core/dtypes/bfloat16"

	"github.com/goaccel/goaccel/backends"
)

// Four goroutine ranks sum their buffers with an asynchronous all-reduce; the counters show the calls.
func ExampleNewInProcessGroup() {
	comms, err := backends.NewInProcessGroup(4)
	if err != nil {
		fmt.Println(err)
		return
	}
	sums := make([][]float32, 4)
	var wg sync.WaitGroup
	for rank, comm := range comms {
		wg.Go(func() {
			buf := []float32{float32(rank), 1}
			pending, err := comm.AllReduceSumAsync(backends.BufferOf(buf))
			if err == nil {
				err = pending.Wait()
			}
			if err != nil {
				fmt.Println(err)
			}
			sums[rank] = buf
		})
	}
	wg.Wait()
	stats := comms[0].Stats().Of(backends.OpAllReduce)
	fmt.Println(sums[0], sums[3], "calls:", stats.Calls, "bytes:", stats.Bytes)
	// Output: [6 4] [6 4] calls: 1 bytes: 8
}

// Without a launcher's environment a program is rank 0 of 1.
func ExampleDetectTopology() {
	topo, err := backends.DetectTopology()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(topo.Rank, topo.WorldSize, topo.IsMain(), topo.Source)
	// Output: 0 1 true default
}

// Open picks a registered collective engine by name; "single" serves a world of one process.
func ExampleOpen() {
	comm, err := backends.Open("single", backends.Topology{WorldSize: 1, LocalSize: 1, Nodes: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer comm.Close()
	buf := []float64{1.5}
	fmt.Println(comm.Name(), comm.Size(), comm.AllReduceSum(backends.BufferOf(buf)), buf)
	_, err = backends.Open("mpi", backends.Topology{WorldSize: 2, LocalSize: 2, Nodes: 1})
	fmt.Println(err != nil)
	// Output:
	// single 1 <nil> [1.5]
	// true
}

// A sharded sync on three goroutine ranks: each reduce-scatters a bucket of six elements and gets the sum
// of its two-element shard, then the ranks all-gather the shards back into the whole summed bucket.
func ExampleCommunicator_ReduceScatterSum() {
	comms, err := backends.NewInProcessGroup(3)
	if err != nil {
		fmt.Println(err)
		return
	}
	shards := make([][]float64, 3)
	whole := make([][]float64, 3)
	var wg sync.WaitGroup
	for rank, comm := range comms {
		wg.Go(func() {
			bucket := []float64{1, 2, 3, 4, 5, 6}
			shards[rank] = make([]float64, 2)
			whole[rank] = make([]float64, 6)
			err := comm.ReduceScatterSum(backends.BufferOf(bucket), backends.BufferOf(shards[rank]))
			if err == nil {
				var p *backends.Pending
				if p, err = comm.AllGatherAsync(backends.BufferOf(shards[rank]), backends.BufferOf(whole[rank])); err == nil {
					err = p.Wait()
				}
			}
			if err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	fmt.Println(shards[0], shards[1], shards[2], whole[1])
	// Output: [3 6] [9 12] [15 18] [3 6 9 12 15 18]
}

// BufferOf classifies a slice once; View and Slice read it back without copying.
func ExampleBufferOf() {
	data := []int32{10, 20, 30, 40}
	buf := backends.BufferOf(data)
	fmt.Println(buf.Kind, buf.Len, buf.Bytes)
	tail := backends.View[int32](buf.Slice(2, 4))
	tail[0] = 99
	fmt.Println(data)
	// Output:
	// int32 4 16
	// [10 20 99 40]
}

// bfloat16 buffers are summed in float32 and rounded back once per addition: 256 + 1 is not a bfloat16
// (8 significant bits) and rounds to even, 256; 1.5 + 1.5 is exact. The buffer counts 2 bytes an element.
func ExampleBFloat16() {
	comms, err := backends.NewInProcessGroup(2)
	if err != nil {
		fmt.Println(err)
		return
	}
	bufs := [][]bfloat16.BFloat16{
		{bfloat16.FromFloat32(256), bfloat16.FromFloat32(1.5)},
		{bfloat16.FromFloat32(1), bfloat16.FromFloat32(1.5)},
	}
	var wg sync.WaitGroup
	for rank, comm := range comms {
		wg.Go(func() {
			if err := comm.AllReduceSum(backends.BufferOf(bufs[rank])); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	fmt.Println(bufs[0], bufs[1], backends.BufferOf(bufs[0]).Kind, comms[0].Stats().Of(backends.OpAllReduce).Bytes, "bytes")
	// Output: [256 3] [256 3] bfloat16 4 bytes
}

// Progress polls a collective in flight without waiting for it, as the goroutine that keeps a gradient
// sync moving while a training step computes does; Wait still gives its result.
func ExamplePending_Progress() {
	comms, err := backends.NewInProcessGroup(2)
	if err != nil {
		fmt.Println(err)
		return
	}
	sums := make([][]float32, 2)
	var wg sync.WaitGroup
	for rank, comm := range comms {
		wg.Go(func() {
			sums[rank] = []float32{float32(rank + 1)}
			p, err := comm.AllReduceSumAsync(backends.BufferOf(sums[rank]))
			if err != nil {
				fmt.Println(err)
				return
			}
			for !p.Progress() {
				// The program's own work goes here.
			}
			if err := p.Wait(); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	fmt.Println(sums[0], sums[1])
	// Output: [3] [3]
}

// KernelShare is what Open found a rank shares its kernel with: here four ranks of a job on one 2-core
// machine (emulated hosts, or containers a launcher counts as separate nodes).
func ExampleKernelShare() {
	share := backends.KernelShare{Ranks: 4, CPUs: 2}
	fmt.Println(share.Oversubscribed(), share.ThreadsPerRank())
	// Output: true 1
}
