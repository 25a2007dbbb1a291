package accumulate

import (
	"fmt"
	"strings"
	"sync"

	"github.com/gomlx/gomlx/pkg/core/dtypes/bfloat16"
	"github.com/x448/float16"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/half"
)

// Compression is the format gradient buckets travel in between ranks (PyTorch DDP's bf16_compress_hook and
// fp16_compress_hook). Only what travels changes: the accumulators, the averaging and the optimizer stay in
// the buckets' own dtype.
type Compression int

const (
	// NoCompression sends buckets in their own dtype: the default.
	NoCompression Compression = iota
	// BF16 sends buckets as bfloat16: half the bytes, float32's range, 8 significant bits.
	BF16
	// FP16 sends buckets as IEEE binary16: half the bytes, 11 significant bits, but a range of ±65504 (a
	// larger gradient element becomes Inf, and the step is refused as non-finite) and less precision below
	// 6.1e-5.
	FP16
)

var compressionNames = [...]string{"none", "bf16", "fp16"}

func (c Compression) String() string {
	if c >= 0 && int(c) < len(compressionNames) {
		return compressionNames[c]
	}
	return fmt.Sprintf("Compression(%d)", int(c))
}

// Valid reports whether c is one of the formats above.
func (c Compression) Valid() bool { return c >= NoCompression && c <= FP16 }

// ParseCompression reads a compression by name: "none", "bf16" or "fp16" (also "bfloat16", "float16",
// "off"; any case, surrounding spaces ignored).
func ParseCompression(s string) (Compression, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "none", "off":
		return NoCompression, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "fp16", "float16":
		return FP16, nil
	}
	return NoCompression, fmt.Errorf("accumulate: unknown gradient compression %q (want bf16, fp16 or none)", s)
}

// CompressionHook is the CommHook that sends buckets as 16-bit floats. Each bucket is rounded to the 16-bit
// format (to nearest, ties to even), reduced through the sharding strategy as a bfloat16 or fp16 buffer,
// whose sum every engine computes in float32 (each addition of two partial sums is done in float32 and
// rounded back to 16 bits once), and the part of the sum this rank owns is written back into the bucket
// in its own dtype. The wire carries half the bytes of a float32 bucket (a quarter of a float64 one).
//
// Numerics: an element of the synced sum over N ranks went through one rounding of each rank's value and
// N-1 roundings of partial sums, each with a relative error of at most u, half the spacing of the format's
// values relative to them: 2^-8 for bfloat16 (8 significant bits), 2^-11 for fp16 (11 bits). So it differs from the exact sum by at most about N·u·Σ|g_r| — relative to the sum of the ranks'
// magnitudes, not to the sum itself, which cancellation can make much smaller (docs/semantics.md section
// 10). The result is the same on every rank, bit for bit: the engines' reductions give every rank the same
// sum, and decoding is exact.
//
// At world size 1 nothing travels and nothing is rounded: the reducer makes no call.
type CompressionHook struct {
	format Compression
	start  func(comm *backends.Communicator, sharding Sharding, b GradBucket) (Waiter, error)
}

// NewCompressionHook returns the hook that sends buckets in format (BF16 or FP16).
func NewCompressionHook(format Compression) (*CompressionHook, error) {
	h := &CompressionHook{format: format}
	switch format {
	case BF16:
		h.start = (&codec[bfloat16.BFloat16]{encode32: half.EncodeBF16[float32], encode64: half.EncodeBF16[float64],
			decode32: half.DecodeBF16[float32], decode64: half.DecodeBF16[float64]}).start
	case FP16:
		h.start = (&codec[float16.Float16]{encode32: half.EncodeFP16[float32], encode64: half.EncodeFP16[float64],
			decode32: half.DecodeFP16[float32], decode64: half.DecodeFP16[float64]}).start
	default:
		return nil, fmt.Errorf("accumulate: a compression hook sends bf16 or fp16, not %s", format)
	}
	return h, nil
}

// Format is the 16-bit format buckets travel in.
func (h *CompressionHook) Format() Compression { return h.format }

// Name implements CommHook: "bf16 compression" or "fp16 compression".
func (h *CompressionHook) Name() string { return h.format.String() + " compression" }

// Start implements CommHook.
func (h *CompressionHook) Start(comm *backends.Communicator, sharding Sharding, b GradBucket) (Waiter, error) {
	return h.start(comm, sharding, b)
}

// codec encodes buckets into 16-bit buffers of type T and decodes the reduced ones. Its buffers are reused
// from sync to sync (a sync.Pool, as a bucket of 25 MB would otherwise allocate 12.5 MB per sync).
type codec[T bfloat16.BFloat16 | float16.Float16] struct {
	encode32 func([]T, []float32)
	encode64 func([]T, []float64)
	decode32 func([]float32, []T)
	decode64 func([]float64, []T)
	wires    sync.Pool // of *[]T
}

func (c *codec[T]) wire(n int) *[]T {
	if w, ok := c.wires.Get().(*[]T); ok && cap(*w) >= n {
		*w = (*w)[:n]
		return w
	}
	w := make([]T, n)
	return &w
}

func (c *codec[T]) start(comm *backends.Communicator, sharding Sharding, b GradBucket) (Waiter, error) {
	wire := c.wire(b.Buffer.Len)
	switch b.Buffer.Kind {
	case backends.Float32:
		c.encode32(*wire, backends.View[float32](b.Buffer))
	case backends.Float64:
		c.encode64(*wire, backends.View[float64](b.Buffer))
	default:
		c.wires.Put(wire)
		return nil, fmt.Errorf("accumulate: bucket %d holds %s: only float32 and float64 buckets can be compressed",
			b.Index, b.Buffer.Kind)
	}
	// The sum comes back into the wire itself when the strategy reduces in place, else into a block of its
	// own, as 16-bit values either way; Wait decodes it into the bucket's shard.
	recvWire := wire
	if b.Shard.Len != b.Buffer.Len {
		recvWire = c.wire(b.Shard.Len)
	}
	reduce, err := sharding.StartReduce(comm, backends.BufferOf(*wire), backends.BufferOf(*recvWire))
	if err != nil {
		c.wires.Put(wire)
		if recvWire != wire {
			c.wires.Put(recvWire)
		}
		return nil, err
	}
	return &decoding[T]{codec: c, reduce: reduce, wire: wire, recvWire: recvWire, shard: b.Shard}, nil
}

// decoding is a compressed bucket in flight: its Wait waits for the reduction, then writes the owned part of
// the sum back into the bucket.
type decoding[T bfloat16.BFloat16 | float16.Float16] struct {
	codec          *codec[T]
	reduce         Waiter
	wire, recvWire *[]T            // what was sent, and where the sum arrives (the same when in place)
	shard          backends.Buffer // where the decoded sum goes

	once sync.Once
	err  error
}

func (d *decoding[T]) Wait() error {
	d.once.Do(func() {
		if d.err = d.reduce.Wait(); d.err != nil {
			// The engine may still hold the wire buffer: it is not reused.
			return
		}
		sum := (*d.recvWire)[:d.shard.Len]
		switch d.shard.Kind {
		case backends.Float32:
			d.codec.decode32(backends.View[float32](d.shard), sum)
		case backends.Float64:
			d.codec.decode64(backends.View[float64](d.shard), sum)
		}
		d.codec.wires.Put(d.wire)
		if d.recvWire != d.wire {
			d.codec.wires.Put(d.recvWire)
		}
	})
	return d.err
}
