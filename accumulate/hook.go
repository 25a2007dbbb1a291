package accumulate

import (
	"fmt"
	"strings"

	"github.com/goaccel/goaccel/backends"
)

// Waiter is a bucket's communication in flight: a *backends.Pending, or a hook's own wrapper around one
// (a compressing hook decompresses in its Wait).
type Waiter interface {
	Wait() error
}

// GradBucket is one bucket as a CommHook sees it: its index in the plan, its layout, its flat gradients on
// the host, and where the hook leaves this rank's synchronised values when its Waiter returns.
type GradBucket struct {
	Index  int
	Layout Bucket
	// Params are the plan's parameters, which Layout's slots index (their names and shapes).
	Params []Param
	// Buffer is the bucket this rank sends, laid out Sharding.Padded long.
	Buffer backends.Buffer
	// Shard is where this rank's synchronised block lands: Buffer itself when the strategy does not split
	// buckets.
	Shard backends.Buffer
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
	return sharding.StartReduce(comm, b.Buffer, b.Shard)
}

// Sharding decides which rank holds which part of the synchronised gradients, and so which collective a
// sync uses. Replicated (every rank holds everything, an all-reduce) is the strategy of data parallelism;
// the ZeRO strategies (ShardOptimizer, ShardGradients) reduce-scatter each bucket so that every rank holds
// and updates its own part of it, and all-gather the updated parameters afterwards.
//
// A bucket of n elements is laid out Padded(n, size) long: a strategy that splits it pads it to a multiple
// of the world size, so that every rank's part is one block of the same length (what a reduce-scatter and
// an all-gather of equal blocks need). Rank r's block is elements [r·block, (r+1)·block) of the padded
// bucket, of which Owned is the part inside the bucket's n real elements (empty for the last ranks of a
// bucket smaller than the world).
type Sharding interface {
	// Name identifies the strategy in settings that ranks compare: "replicated", "optimizer" or
	// "gradients".
	Name() string
	// Stage is the strategy's ZeRO stage: 0 holds everything on every rank, 1 shards the optimizer's state,
	// 2 also the synchronised gradients.
	Stage() int
	// Padded is the length a bucket of n elements is laid out with on size ranks.
	Padded(n, size int) int
	// Owned is the range of a bucket of n elements whose synchronised values rank holds after a sync.
	Owned(n, rank, size int) (from, to int)
	// StartReduce begins the collective that leaves recv holding the sum across ranks of this rank's block
	// of send. send is a bucket laid out Padded long; recv is the block (Padded/size elements), or send
	// itself when the strategy does not split buckets (Replicated sums in place).
	StartReduce(comm *backends.Communicator, send, recv backends.Buffer) (Waiter, error)
}

// ParseSharding reads a strategy by name: "replicated" (also "none", "off", "0"), "optimizer" (also
// "zero1", "1") or "gradients" (also "zero2", "2"); any case, surrounding spaces ignored.
func ParseSharding(s string) (Sharding, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "replicated", "none", "off", "0":
		return Replicated{}, nil
	case "optimizer", "zero1", "1":
		return ShardOptimizer{}, nil
	case "gradients", "zero2", "2":
		return ShardGradients{}, nil
	}
	return nil, fmt.Errorf("accumulate: unknown sharding strategy %q (want replicated, optimizer or gradients)", s)
}

// Replicated keeps every rank's whole gradient: each bucket is all-reduced. The default strategy.
type Replicated struct{}

// Name implements Sharding.
func (Replicated) Name() string { return "replicated" }

// Stage implements Sharding: 0.
func (Replicated) Stage() int { return 0 }

// Padded implements Sharding: buckets are not padded.
func (Replicated) Padded(n, _ int) int { return n }

// StartReduce implements Sharding: an all-reduce of send, in place (recv must be send).
func (Replicated) StartReduce(comm *backends.Communicator, send, recv backends.Buffer) (Waiter, error) {
	if recv.Len != send.Len {
		return nil, fmt.Errorf("accumulate: a replicated reduction is in place: %d elements received for %d sent",
			recv.Len, send.Len)
	}
	return comm.AllReduceSumAsync(send)
}

// Owned implements Sharding: every rank owns the whole bucket.
func (Replicated) Owned(n, _, _ int) (from, to int) { return 0, n }

// ShardOptimizer is ZeRO stage 1: each rank keeps the optimizer's state for its block of every bucket and
// updates only that block of the parameters. The gradients are reduce-scattered (each rank receives the
// sum of its block) and the updated blocks all-gathered, the same bytes on the wire as one all-reduce.
// Every rank still accumulates the whole gradient between syncs.
type ShardOptimizer struct{ blocks }

// Name implements Sharding.
func (ShardOptimizer) Name() string { return "optimizer" }

// Stage implements Sharding: 1.
func (ShardOptimizer) Stage() int { return 1 }

// ShardGradients is ZeRO stage 2: ShardOptimizer, and the synchronised gradients are kept only for the
// rank's block. A micro-batch that syncs straight after the last step hands its gradients to the
// reduce-scatter without adding them into a whole-model accumulator; one is made only for micro-batches
// that accumulate without syncing (gradient accumulation, NoSync).
type ShardGradients struct{ blocks }

// Name implements Sharding.
func (ShardGradients) Name() string { return "gradients" }

// Stage implements Sharding: 2.
func (ShardGradients) Stage() int { return 2 }

// blocks is the layout and the collective of the strategies that split buckets into one block per rank.
type blocks struct{}

// Padded implements Sharding: n rounded up to a multiple of size.
func (blocks) Padded(n, size int) int { return BlockLen(n, size) * size }

// Owned implements Sharding: the real elements of rank's block.
func (blocks) Owned(n, rank, size int) (from, to int) {
	block := BlockLen(n, size)
	from = min(rank*block, n)
	return from, min(from+block, n)
}

// StartReduce implements Sharding: a reduce-scatter of send into recv.
func (blocks) StartReduce(comm *backends.Communicator, send, recv backends.Buffer) (Waiter, error) {
	return comm.ReduceScatterSumAsync(send, recv)
}

// BlockLen is the length of each rank's block of a bucket of n elements split over size ranks: n/size
// rounded up, at least 1 (a bucket smaller than the world still gives every rank a block, mostly padding).
func BlockLen(n, size int) int { return max(1, (n+size-1)/max(size, 1)) }
