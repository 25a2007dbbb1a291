package bench

import "github.com/goaccel/goaccel/backends"

// The what-if run (accelbench -what-if) measures changes to goaccel before anyone makes them; it is how
// the ring algorithm and the non-sleeping wait loop of commit cfa8dcf were first measured. The ring is an
// environment setting (RingAlgorithmEnv). A wait loop that never sleeps is emulated from outside the
// Communicator: an engine wrapper whose requests' Test does the polling itself, so the Communicator's
// first Test already returns the completed request and its own back-off never starts.

// yieldingEngine wraps an engine so that every request polls to completion inside Test, yielding the
// processor with sched_yield between polls.
type yieldingEngine struct{ backends.Engine }

// newYieldingCommunicator is a Communicator over engine whose waits never sleep.
func newYieldingCommunicator(name string, engine backends.Engine, opts ...backends.CommunicatorOption) *backends.Communicator {
	return backends.NewCommunicator(name, yieldingEngine{engine}, opts...)
}

func (e yieldingEngine) StartAllReduceSum(buf any) (backends.Request, error) {
	return yielding(e.Engine.StartAllReduceSum(buf))
}

func (e yieldingEngine) StartBroadcast(buf any, root int) (backends.Request, error) {
	return yielding(e.Engine.StartBroadcast(buf, root))
}

func (e yieldingEngine) StartAllGather(send, recv any) (backends.Request, error) {
	return yielding(e.Engine.StartAllGather(send, recv))
}

func (e yieldingEngine) StartBarrier() (backends.Request, error) {
	return yielding(e.Engine.StartBarrier())
}

func yielding(r backends.Request, err error) (backends.Request, error) {
	if err != nil {
		return nil, err
	}
	return yieldingRequest{r}, nil
}

type yieldingRequest struct{ backends.Request }

// Test polls until the request completes. Accumulate.Reducer starts every bucket before it waits for the
// first, so the outstanding buckets still progress together: MPI advances all of them on every poll.
func (r yieldingRequest) Test() (bool, error) {
	for {
		if done, err := r.Request.Test(); done || err != nil {
			return done, err
		}
		schedYield()
	}
}
