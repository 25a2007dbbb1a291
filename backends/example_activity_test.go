package backends_test

import (
	"fmt"

	"github.com/goaccel/goaccel/backends"
)

// Activity says where a rank stands: its latest collective and, while it waits in one, which and since
// when. A hang report prints it.
func ExampleCommunicator_Activity() {
	comm := backends.NewSingle()
	comm.SetDescriber(func() string { return "optimizer step 3" })
	_ = comm.AllReduceSum(backends.BufferOf(make([]float32, 256)))
	a := comm.Activity()
	fmt.Printf("#%d %s (%d bytes), waiting: %v, doing: %s\n", a.Seq, a.Call, a.Bytes, a.Waiting, a.Context)
	// Output: #1 all-reduce of float32[256] (1024 bytes), waiting: false, doing: optimizer step 3
}
