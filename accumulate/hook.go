package accumulate

import (
	"github.com/goaccel/goaccel/backends"
)

// Waiter is a bucket's communication in flight: a *backends.Pending, or a hook's own wrapper around one
// (a compressing hook decompresses in its Wait).
type Waiter interface {
	Wait() error
}

// GradBucket is one bucket as a CommHook sees it: its index in the plan, its layout, and its flat
// accumulator on the host, which the hook leaves holding this rank's synchronised values when its Waiter
// returns.
type GradBucket struct {
	Index  int
	Layout Bucket
	Buffer backends.Buffer
}

// CommHook carries a bucket between ranks, as a communication hook registered on PyTorch DDP's reducer
// does: the identity hook sums the bucket as it is; a compressing hook would encode it into a narrower
// buffer, reduce that through the sharding strategy, and decode in its Waiter's Wait. Every rank must use
// the same hook.
type CommHook interface {
	// Name identifies the hook in settings that ranks compare.
	Name() string
	// Start begins the communication of bucket b, reducing it through sharding. It must not block on the
	// other ranks: the reducer starts every bucket before waiting for any.
	Start(comm *backends.Communicator, sharding Sharding, b GradBucket) (Waiter, error)
}

// IdentityHook reduces each bucket unchanged: the default hook.
type IdentityHook struct{}

// Name implements CommHook.
func (IdentityHook) Name() string { return "identity" }

// Start implements CommHook.
func (IdentityHook) Start(comm *backends.Communicator, sharding Sharding, b GradBucket) (Waiter, error) {
	return sharding.StartReduce(comm, b.Buffer)
}

// Sharding decides which rank holds which part of the synchronised gradients, and so which collective a
// sync uses. Replicated (every rank holds everything, an all-reduce) is the strategy of data parallelism;
// a ZeRO-1 strategy would reduce-scatter each bucket so that every rank holds and updates its shard.
type Sharding interface {
	// Name identifies the strategy in settings that ranks compare.
	Name() string
	// StartReduce begins the collective that leaves this rank with the sum across ranks of the part of buf
	// it owns (see Owned), in place.
	StartReduce(comm *backends.Communicator, buf backends.Buffer) (Waiter, error)
	// Owned is the range of a bucket of n elements whose synchronised values rank holds after a sync.
	Owned(n, rank, size int) (from, to int)
}

// Replicated keeps every rank's whole gradient: each bucket is all-reduced. The default strategy.
type Replicated struct{}

// Name implements Sharding.
func (Replicated) Name() string { return "replicated" }

// StartReduce implements Sharding.
func (Replicated) StartReduce(comm *backends.Communicator, buf backends.Buffer) (Waiter, error) {
	return comm.AllReduceSumAsync(buf)
}

// Owned implements Sharding: every rank owns the whole bucket.
func (Replicated) Owned(n, _, _ int) (from, to int) { return 0, n }
