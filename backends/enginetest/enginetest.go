// Package enginetest checks that a collective engine behaves as backends.Engine promises. It is meant for
// engine authors and for goaccel's own tests: every rank of a group calls [Check] on its Communicator at the
// same time, and each gets back nil or what went wrong on that rank.
//
// Check runs a fixed sequence of collectives — all-reduces of every element kind (the 16-bit float kinds
// included) with rank-dependent values and lengths 0, 1, 7 and about a million; several all-reduces in flight at once, waited in a different
// order than started; a broadcast from every root; all-gathers; reduce-scatters of every kind, and a
// sharded gradient sync (reduce-scatter, then all-gather of the summed shards) with both halves in flight
// beside an all-reduce; barriers; and calls the Communicator must
// reject without talking — and verifies every result exactly. The values are chosen so that sums are exact
// in any reduction order (integers and small binary fractions for floats, integers of a few bits times a
// power of two for bfloat16 and fp16; uint8 sums wrap modulo 256, as in C), so an engine free to reorder its
// reduction still has exactly one right answer. On one or two ranks, where a sum is a single addition and
// so has one right answer whatever the order, it also sums 16-bit values that must round, and checks the
// rounding against package half's (float32 addition, round to nearest even). Finally it checks that the
// Communicator's counters grew by exactly the calls and bytes of the sequence.
//
// The same sequence runs in a goroutine per rank of an in-process group, in the single-process engine, and
// in each process of an `mpirun -np N` job, which is how goaccel checks its MPI binding.
package enginetest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"unsafe"

	"github.com/gomlx/gomlx/pkg/core/dtypes/bfloat16"
	"github.com/x448/float16"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/half"
)

// DefaultLargeLen is the length of the large all-reduce buffers: a million elements, the size of a typical
// gradient bucket, big enough that MPI implementations switch to their large-message algorithms.
const DefaultLargeLen = 1 << 20

// maxReported bounds how many verification failures one Check reports.
const maxReported = 8

// Option configures Check.
type Option func(*config)

type config struct {
	largeLen int
}

// WithLargeLen sets the length of the large all-reduce buffers (DefaultLargeLen by default). Every rank
// must use the same value.
func WithLargeLen(n int) Option {
	return func(c *config) { c.largeLen = n }
}

// Check runs the conformance sequence on comm and verifies every result and the counters. Every rank of
// comm's group must call it concurrently with the same options.
//
// A result that is wrong on this rank does not stop the sequence — stopping would leave the other ranks
// waiting in the next collective — so Check reports up to a handful of wrong results together. An error from
// the Communicator itself does stop it, since the group is then out of step.
func Check(comm *backends.Communicator, opts ...Option) error {
	cfg := config{largeLen: DefaultLargeLen}
	for _, opt := range opts {
		opt(&cfg)
	}
	if cfg.largeLen < 0 {
		return fmt.Errorf("enginetest: large length %d is negative", cfg.largeLen)
	}
	c := &checker{comm: comm, rank: comm.Rank(), size: comm.Size(), before: comm.Stats()}
	steps := []func() error{
		func() error { return c.allReduces(cfg.largeLen) },
		c.halfRounding,
		c.asyncAllReduces,
		c.broadcasts,
		c.allGathers,
		c.reduceScatters,
		c.shardedSync,
		c.barriers,
		c.rejectedCalls,
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("enginetest: rank %d of %d on engine %q: %w", c.rank, c.size, comm.Name(), err)
		}
	}
	c.checkStats()
	if len(c.wrong) > 0 {
		return fmt.Errorf("enginetest: rank %d of %d on engine %q: %w", c.rank, c.size, comm.Name(),
			errors.Join(c.wrong...))
	}
	return nil
}

type checker struct {
	comm       *backends.Communicator
	rank, size int
	before     backends.Stats
	// wantCalls and wantBytes are what the counters must have grown by, per operation.
	wantCalls, wantBytes [len(backends.Stats{}.PerOp)]int64
	wrong                []error
}

func (c *checker) fail(err error) {
	if len(c.wrong) < maxReported {
		c.wrong = append(c.wrong, err)
	}
}

func (c *checker) count(op backends.Op, bytes int) {
	c.wantCalls[op]++
	c.wantBytes[op] += int64(bytes)
}

// number is the element types Go can add with +.
type number interface {
	~float32 | ~float64 | ~int32 | ~int64 | ~uint8
}

func plus[T number](a, b T) T { return a + b }

// kindCase builds buffers of one element kind. Values depend on rank and index, and are exact under
// summation in any order.
type kindCase struct {
	kind     backends.ElementKind
	elemSize int
	// fill returns rank's n-element buffer.
	fill func(rank, n int) any
	// sum returns the element-wise sum of fill(r, n) over ranks 0..size-1.
	sum func(size, n int) any
	// concat returns fill(0, n), fill(1, n), ... fill(size-1, n) end to end.
	concat func(size, n int) any
	// slice returns buf's elements [from, to).
	slice func(buf any, from, to int) any
	// compare describes the first difference between got and want, or returns nil.
	compare func(got, want any) error
}

// newKindCase builds the case of one element type; add is the engines' sum of two elements.
func newKindCase[T comparable](kind backends.ElementKind, value func(rank, i int) T, add func(a, b T) T) kindCase {
	var zero T
	return kindCase{
		kind:     kind,
		elemSize: int(unsafe.Sizeof(zero)),
		fill: func(rank, n int) any {
			b := make([]T, n)
			for i := range b {
				b[i] = value(rank, i)
			}
			return b
		},
		sum: func(size, n int) any {
			b := make([]T, n)
			for r := range size {
				for i := range b {
					if r == 0 {
						b[i] = value(r, i)
					} else {
						b[i] = add(b[i], value(r, i))
					}
				}
			}
			return b
		},
		concat: func(size, n int) any {
			b := make([]T, 0, size*n)
			for r := range size {
				for i := range n {
					b = append(b, value(r, i))
				}
			}
			return b
		},
		slice: func(buf any, from, to int) any { return buf.([]T)[from:to] },
		compare: func(gotAny, wantAny any) error {
			got, want := gotAny.([]T), wantAny.([]T)
			if len(got) != len(want) {
				return fmt.Errorf("length %d, want %d", len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					return fmt.Errorf("element %d is %s, want %s", i, show(got[i]), show(want[i]))
				}
			}
			return nil
		},
	}
}

// kindCases covers every element kind. Signs alternate so that sums cross zero; the magnitudes use the
// high bits of the integer kinds, and uint8 sums overflow on purpose. The 16-bit float values are
// integers below 16 times a power of two that varies with the index (over bfloat16's wide exponent range,
// and fp16's narrow one), with one sign per index: every partial sum of up to 8 ranks is an integer below
// 256 times that power, exact in both formats.
var kindCases = []kindCase{
	newKindCase(backends.Float32, func(rank, i int) float32 {
		v := float32((rank+1)*(i%13+1)) + float32(rank%4)/4
		if i%2 == 1 {
			v = -v
		}
		return v
	}, plus),
	newKindCase(backends.Float64, func(rank, i int) float64 {
		v := float64(rank+1)*(1<<33) + float64(i%1021) + float64(rank%2)/2
		if i%3 == 1 {
			v = -v
		}
		return v
	}, plus),
	newKindCase(backends.Int32, func(rank, i int) int32 {
		return int32((rank+1)*100_003 - (i%9973)*(rank%3+1)*1000)
	}, plus),
	newKindCase(backends.Int64, func(rank, i int) int64 {
		return int64(rank+1)<<40 - int64(i)*int64(rank+1)
	}, plus),
	newKindCase(backends.Uint8, func(rank, i int) uint8 {
		return uint8(rank*37 + i*11 + 200)
	}, plus),
	newKindCase(backends.BFloat16, func(rank, i int) bfloat16.BFloat16 {
		return half.BF16(exactHalf(rank, i, 10*(i%11-5)))
	}, half.SumBF16),
	newKindCase(backends.Float16, func(rank, i int) float16.Float16 {
		return half.FP16(exactHalf(rank, i, i%11-8))
	}, half.SumFP16),
}

// show formats an element for an error: 16-bit floats by their value (their String prints every digit).
func show(v any) string {
	switch x := v.(type) {
	case bfloat16.BFloat16:
		return fmt.Sprintf("%g", x.Float32())
	case float16.Float16:
		return fmt.Sprintf("%g", x.Float32())
	}
	return fmt.Sprint(v)
}

// exactHalf is the 16-bit cases' value: (rank mod 3 + 1)·(i mod 5 + 1)·2^exp, negative for odd i.
func exactHalf(rank, i, exp int) float32 {
	v := float32(math.Ldexp(float64((rank%3+1)*(i%5+1)), exp))
	if i%2 == 1 {
		v = -v
	}
	return v
}

// halfRounding sums bfloat16 and fp16 values whose sums round, on one or two ranks: there the sum is one
// addition (or none), which has one right answer in any order, so the engine's rounding is checked exactly
// against package half's. Values are random finite 16-bit patterns, drawn per rank from a fixed seed.
func (c *checker) halfRounding() error {
	if c.size > 2 {
		return nil
	}
	bfFinite := func(v uint16) bool { return v&0x7f80 != 0x7f80 }
	fpFinite := func(v uint16) bool { return v&0x7c00 != 0x7c00 }
	if err := roundedSum(c, func(rank int) []bfloat16.BFloat16 { return drawHalves[bfloat16.BFloat16](rank, bfFinite) },
		half.SumBF16); err != nil {
		return err
	}
	return roundedSum(c, func(rank int) []float16.Float16 { return drawHalves[float16.Float16](rank, fpFinite) },
		half.SumFP16)
}

// drawHalves is rank's values for halfRounding: 4099 finite 16-bit patterns.
func drawHalves[T ~uint16](rank int, finite func(uint16) bool) []T {
	const n = 4099
	rng := rand.New(rand.NewPCG(uint64(rank)+11, 13))
	vals := make([]T, 0, n)
	for len(vals) < n {
		if v := uint16(rng.Uint32()); finite(v) {
			vals = append(vals, T(v))
		}
	}
	return vals
}

// roundedSum all-reduces this rank's values of(rank) and compares the result with every rank's values
// added in rank order.
func roundedSum[T bfloat16.BFloat16 | float16.Float16](c *checker, of func(rank int) []T, add func(a, b T) T) error {
	buf := of(c.rank)
	want := of(0)
	for r := 1; r < c.size; r++ {
		for i, v := range of(r) {
			want[i] = add(want[i], v)
		}
	}
	b := backends.BufferOf(buf)
	if err := c.comm.AllReduceSum(backends.BufferOf(buf)); err != nil {
		return fmt.Errorf("rounded all-reduce %s[%d]: %w", b.Kind, b.Len, err)
	}
	c.count(backends.OpAllReduce, b.Bytes)
	for i := range buf {
		if buf[i] != want[i] {
			c.fail(fmt.Errorf("rounded all-reduce %s[%d]: element %d is %s (%#04x), want %s (%#04x)", b.Kind, b.Len, i,
				show(buf[i]), uint16(buf[i]), show(want[i]), uint16(want[i])))
			break
		}
	}
	return nil
}

// allReduces sums buffers of every kind and length, one collective at a time.
func (c *checker) allReduces(largeLen int) error {
	for _, kc := range kindCases {
		for _, n := range []int{0, 1, 7, largeLen} {
			buf := kc.fill(c.rank, n)
			if err := c.comm.AllReduceSum(asBuffer(buf)); err != nil {
				return fmt.Errorf("all-reduce %s[%d]: %w", kc.kind, n, err)
			}
			c.count(backends.OpAllReduce, n*kc.elemSize)
			if err := kc.compare(buf, kc.sum(c.size, n)); err != nil {
				c.fail(fmt.Errorf("all-reduce %s[%d]: %w", kc.kind, n, err))
			}
		}
	}
	return nil
}

// asyncAllReduces keeps several all-reduces in flight and waits for them in an order unrelated to the order
// they started in, then overlaps a second wave with the tail of the first: the pattern of a bucketed
// gradient sync.
func (c *checker) asyncAllReduces() error {
	type inFlight struct {
		kc      kindCase
		n       int
		buf     any
		pending *backends.Pending
	}
	var started []*inFlight
	startOne := func(kc kindCase, n int) error {
		f := &inFlight{kc: kc, n: n, buf: kc.fill(c.rank, n)}
		var err error
		if f.pending, err = c.comm.AllReduceSumAsync(asBuffer(f.buf)); err != nil {
			return fmt.Errorf("starting async all-reduce #%d %s[%d]: %w", len(started), kc.kind, n, err)
		}
		c.count(backends.OpAllReduce, n*kc.elemSize)
		started = append(started, f)
		return nil
	}
	waitOne := func(i int) error {
		f := started[i]
		if err := f.pending.Wait(); err != nil {
			return fmt.Errorf("waiting for async all-reduce #%d %s[%d]: %w", i, f.kc.kind, f.n, err)
		}
		if err := f.kc.compare(f.buf, f.kc.sum(c.size, f.n)); err != nil {
			c.fail(fmt.Errorf("async all-reduce #%d %s[%d]: %w", i, f.kc.kind, f.n, err))
		}
		return nil
	}
	// Wave one: five in flight, one of each kind, waited 3, 0, 4, 1.
	for i, n := range []int{1000, 1 << 16, 3, 0, 100_000} {
		if err := startOne(kindCases[i], n); err != nil {
			return err
		}
	}
	for _, i := range []int{3, 0, 4, 1} {
		if err := waitOne(i); err != nil {
			return err
		}
	}
	// Wave two starts while #2 of wave one is still outstanding.
	for i, n := range []int{4097, 1} {
		if err := startOne(kindCases[(i+2)%len(kindCases)], n); err != nil {
			return err
		}
	}
	for _, i := range []int{6, 2, 5} {
		if err := waitOne(i); err != nil {
			return err
		}
	}
	// Waiting again must return the same (nil) result without another collective.
	if err := started[0].pending.Wait(); err != nil {
		return fmt.Errorf("second wait of async all-reduce #0: %w", err)
	}
	return nil
}

// broadcasts sends from every root in turn, one kind after another, plus an empty broadcast.
func (c *checker) broadcasts() error {
	for root := range c.size {
		for k, kc := range kindCases {
			n := 257 + 31*root + k
			buf := kc.fill(c.rank, n)
			if err := c.comm.Broadcast(asBuffer(buf), root); err != nil {
				return fmt.Errorf("broadcast %s[%d] from root %d: %w", kc.kind, n, root, err)
			}
			c.count(backends.OpBroadcast, n*kc.elemSize)
			if err := kc.compare(buf, kc.fill(root, n)); err != nil {
				c.fail(fmt.Errorf("broadcast %s[%d] from root %d: %w", kc.kind, n, root, err))
			}
		}
	}
	root := c.size - 1
	empty := kindCases[0].fill(c.rank, 0)
	if err := c.comm.Broadcast(asBuffer(empty), root); err != nil {
		return fmt.Errorf("empty broadcast from root %d: %w", root, err)
	}
	c.count(backends.OpBroadcast, 0)
	return nil
}

// allGathers gathers a small buffer of every kind, an empty one and a larger one.
func (c *checker) allGathers() error {
	gather := func(kc kindCase, n int) error {
		send := kc.fill(c.rank, n)
		recv := kc.fill(c.size+7, n*c.size) // garbage that must be overwritten everywhere
		if err := c.comm.AllGather(asBuffer(send), asBuffer(recv)); err != nil {
			return fmt.Errorf("all-gather %s[%d]: %w", kc.kind, n, err)
		}
		c.count(backends.OpAllGather, n*kc.elemSize)
		if err := kc.compare(recv, kc.concat(c.size, n)); err != nil {
			c.fail(fmt.Errorf("all-gather %s[%d]: %w", kc.kind, n, err))
		}
		if err := kc.compare(send, kc.fill(c.rank, n)); err != nil {
			c.fail(fmt.Errorf("all-gather %s[%d] changed its send buffer: %w", kc.kind, n, err))
		}
		return nil
	}
	for _, kc := range kindCases {
		if err := gather(kc, 5); err != nil {
			return err
		}
	}
	if err := gather(kindCases[2], 0); err != nil {
		return err
	}
	return gather(kindCases[1], 1<<15)
}

// reduceScatters sums every kind's buffers of Size() blocks and checks that each rank got its block of the
// sum, for blocks of 0, 1 and 7 elements and a large one; then blocks of more than 4 MiB (an engine that
// moves a block in pieces must put them back in order); then several at once, waited for out of order and
// in a different order on odd ranks.
func (c *checker) reduceScatters() error {
	type inFlight struct {
		kc         kindCase
		n          int
		send, recv any
		pending    *backends.Pending
	}
	start := func(kc kindCase, n int) (*inFlight, error) {
		f := &inFlight{kc: kc, n: n, send: kc.fill(c.rank, n*c.size), recv: kc.fill(c.size+3, n)} // recv: garbage
		var err error
		if f.pending, err = c.comm.ReduceScatterSumAsync(asBuffer(f.send), asBuffer(f.recv)); err != nil {
			return nil, fmt.Errorf("reduce-scatter %s[%d]: %w", kc.kind, n*c.size, err)
		}
		c.count(backends.OpReduceScatter, n*c.size*kc.elemSize)
		return f, nil
	}
	finish := func(f *inFlight) error {
		kc, n := f.kc, f.n
		if err := f.pending.Wait(); err != nil {
			return fmt.Errorf("reduce-scatter %s[%d]: %w", kc.kind, n*c.size, err)
		}
		want := kc.slice(kc.sum(c.size, n*c.size), c.rank*n, (c.rank+1)*n)
		if err := kc.compare(f.recv, want); err != nil {
			c.fail(fmt.Errorf("reduce-scatter %s[%d]: %w", kc.kind, n*c.size, err))
		}
		if err := kc.compare(f.send, kc.fill(c.rank, n*c.size)); err != nil {
			c.fail(fmt.Errorf("reduce-scatter %s[%d] changed its send buffer: %w", kc.kind, n*c.size, err))
		}
		return nil
	}
	one := func(kc kindCase, n int) error {
		f, err := start(kc, n)
		if err != nil {
			return err
		}
		return finish(f)
	}
	for _, kc := range kindCases {
		for _, n := range []int{0, 1, 7, 4099} {
			if err := one(kc, n); err != nil {
				return err
			}
		}
	}
	for _, kc := range []kindCase{kindCases[0], kindCases[5]} { // float32 and bfloat16
		if err := one(kc, 5<<20/kc.elemSize+3); err != nil {
			return err
		}
	}
	// Waited for in another order on odd ranks: MPI lets each rank complete its requests in any order, so
	// an engine must keep every collective in flight moving whichever one a rank waits for.
	var started []*inFlight
	for i, n := range []int{4099, 1, 1<<20 + 1, 7} {
		f, err := start(kindCases[i%2], n)
		if err != nil {
			return err
		}
		started = append(started, f)
	}
	order := []int{2, 0, 3, 1}
	if c.rank%2 == 1 {
		order = []int{1, 3, 0, 2}
	}
	for _, i := range order {
		if err := finish(started[i]); err != nil {
			return err
		}
	}
	return nil
}

// shardedSync is the collective pattern of a ZeRO-1 gradient sync: each rank reduce-scatters a bucket,
// owns the sum of its shard, and all-gathers the shards back into a whole bucket; an all-reduce of another
// bucket stays in flight across both halves, as a bucketed sync keeps several buckets in flight. The
// gathered bucket must equal the all-reduced one.
func (c *checker) shardedSync() error {
	kc := kindCases[1] // float64: every sum exact
	const shard = 1 << 12
	other := kc.fill(c.rank, 3*shard)
	inFlight, err := c.comm.AllReduceSumAsync(asBuffer(other))
	if err != nil {
		return fmt.Errorf("sharded sync: starting the all-reduce beside it: %w", err)
	}
	c.count(backends.OpAllReduce, 3*shard*kc.elemSize)
	bucket := kc.fill(c.rank, shard*c.size)
	mine := kc.fill(0, shard)
	scatter, err := c.comm.ReduceScatterSumAsync(asBuffer(bucket), asBuffer(mine))
	if err != nil {
		return fmt.Errorf("sharded sync: starting the reduce-scatter: %w", err)
	}
	c.count(backends.OpReduceScatter, shard*c.size*kc.elemSize)
	if err := scatter.Wait(); err != nil {
		return fmt.Errorf("sharded sync: reduce-scatter: %w", err)
	}
	gathered := kc.fill(c.size+5, shard*c.size)
	gather, err := c.comm.AllGatherAsync(asBuffer(mine), asBuffer(gathered))
	if err != nil {
		return fmt.Errorf("sharded sync: starting the all-gather: %w", err)
	}
	c.count(backends.OpAllGather, shard*kc.elemSize)
	if err := gather.Wait(); err != nil {
		return fmt.Errorf("sharded sync: all-gather: %w", err)
	}
	if err := inFlight.Wait(); err != nil {
		return fmt.Errorf("sharded sync: the all-reduce beside it: %w", err)
	}
	if err := kc.compare(gathered, kc.sum(c.size, shard*c.size)); err != nil {
		c.fail(fmt.Errorf("sharded sync: gathered shards: %w", err))
	}
	if err := kc.compare(other, kc.sum(c.size, 3*shard)); err != nil {
		c.fail(fmt.Errorf("sharded sync: the all-reduce beside it: %w", err))
	}
	return nil
}

func (c *checker) barriers() error {
	for i := range 3 {
		if err := c.comm.Barrier(); err != nil {
			return fmt.Errorf("barrier #%d: %w", i, err)
		}
		c.count(backends.OpBarrier, 0)
	}
	return nil
}

// rejectedCalls makes calls that the Communicator must refuse before they reach the engine: they return an
// error on every rank alike, are not counted, and leave the group usable.
func (c *checker) rejectedCalls() error {
	rejected := []struct {
		what string
		call func() error
	}{
		{"broadcast from root == size", func() error { return c.comm.Broadcast(backends.BufferOf([]float32{1}), c.size) }},
		{"broadcast from root -1", func() error { return c.comm.Broadcast(backends.BufferOf([]float32{1}), -1) }},
		{"all-reduce of a malformed buffer", func() error {
			return c.comm.AllReduceSum(backends.Buffer{Kind: backends.Float32, Len: 2, Bytes: 4})
		}},
		{"all-gather into a short buffer", func() error {
			return c.comm.AllGather(backends.BufferOf([]int32{1, 2}), backends.BufferOf(make([]int32, 2*c.size-1)))
		}},
		{"all-gather across kinds", func() error {
			return c.comm.AllGather(backends.BufferOf([]int32{1}), backends.BufferOf(make([]int64, c.size)))
		}},
		{"reduce-scatter into a long buffer", func() error {
			return c.comm.ReduceScatterSum(backends.BufferOf(make([]float32, 2*c.size)), backends.BufferOf(make([]float32, 3)))
		}},
		{"reduce-scatter across kinds", func() error {
			return c.comm.ReduceScatterSum(backends.BufferOf(make([]float32, c.size)), backends.BufferOf(make([]float64, 1)))
		}},
		{"reduce-scatter of an unknown element kind", func() error {
			return c.comm.ReduceScatterSum(backends.Buffer{Kind: 99, Len: 0}, backends.Buffer{Kind: 99, Len: 0})
		}},
	}
	for _, r := range rejected {
		if err := r.call(); err == nil {
			c.fail(fmt.Errorf("%s was accepted", r.what))
		}
	}
	if err := c.comm.Broken(); err != nil {
		return fmt.Errorf("rejected calls broke the communicator: %w", err)
	}
	// The group must still work after the rejections.
	if err := c.comm.Barrier(); err != nil {
		return fmt.Errorf("barrier after rejected calls: %w", err)
	}
	c.count(backends.OpBarrier, 0)
	return nil
}

func (c *checker) checkStats() {
	delta := c.comm.Stats().Sub(c.before)
	for op := range backends.Op(len(backends.Stats{}.PerOp)) {
		got := delta.Of(op)
		if got.Calls != c.wantCalls[op] || got.Bytes != c.wantBytes[op] {
			c.fail(fmt.Errorf("counters: %s counted %d calls and %d bytes, want %d calls and %d bytes",
				op, got.Calls, got.Bytes, c.wantCalls[op], c.wantBytes[op]))
		}
		if got.Wait < 0 {
			c.fail(fmt.Errorf("counters: %s wait time %s is negative", op, got.Wait))
		}
	}
}

// asBuffer classifies a kind case's slice: the cases hold their slices as any, one per element kind.
func asBuffer(slice any) backends.Buffer {
	b, err := backends.Elements(slice)
	if err != nil {
		panic(err) // a kind case of an element type collectives do not take: a bug in this file
	}
	return b
}
