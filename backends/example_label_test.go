package backends_test

import (
	"fmt"
	"sync"

	"github.com/goaccel/goaccel/backends"
)

// SetNextLabel says what the next collective carries: the communicator's observer, and Activity in a
// hang report, show it beside the call.
func ExampleCommunicator_SetNextLabel() {
	comms, _ := backends.NewInProcessGroup(2)
	comms[0].SetObserver(func(r backends.CollectiveRecord) {
		fmt.Printf("#%d %s %s: %s\n", r.Seq, r.Op, r.Label, r.Call())
	})
	var wg sync.WaitGroup
	for _, c := range comms {
		wg.Go(func() {
			c.SetNextLabel(backends.BucketLabel(3, 8<<20))
			_ = c.AllReduceSum(backends.BufferOf(make([]float32, 2<<20)))
		})
	}
	wg.Wait()
	fmt.Println("latest:", comms[0].Activity().Label)
	// Output:
	// #1 all-reduce bucket 3 (8.0 MiB): all-reduce of float32[2097152]
	// latest: bucket 3 (8.0 MiB)
}
