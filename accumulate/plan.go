// Package accumulate decides when gradients are synchronised and how: the GradientState that turns calls
// of Accumulate and NoSync into a sync flag, the bucket Plan that lays gradients out in flat accumulators,
// and the Reducer that owns those accumulators and their synchronisation, through a CommHook and a
// Sharding strategy (docs/semantics.md, section 10).
//
// Accumulators are the buckets: every micro-batch adds its flattened gradients straight into one flat
// variable per bucket, so a sync hands whole buckets to the collective engine without packing them.
package accumulate

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// DefaultFirstBucketBytes is the size of the first bucket. The first bucket holds the last layers, whose
// gradients backward produces first; torch DDP keeps it small so that its all-reduce can start while
// backward goes on. Here every sync starts after the whole compiled step returns, so the size only shapes
// the layout; it is kept so that a sync overlapping backward can use the same plan.
const DefaultFirstBucketBytes = 1 << 20

// DefaultBucketCapBytes is the default cap on later buckets (25 MB, DDP's default).
const DefaultBucketCapBytes = 25 << 20

// Param describes one trainable variable to plan for.
type Param struct {
	Name  string
	Shape shapes.Shape
}

// Slot places one parameter inside a bucket.
type Slot struct {
	Param  int // index into Plan.Params
	Offset int // in elements, inside the bucket
	Size   int // in elements
}

// Bucket is one flat accumulator: parameters of a single dtype laid end to end.
type Bucket struct {
	DType dtypes.DType
	Slots []Slot
	Size  int // elements
}

// Bytes is the bucket's size in bytes.
func (b Bucket) Bytes() int { return b.Size * b.DType.Size() }

// Plan assigns every parameter to exactly one slot of one bucket.
type Plan struct {
	Params  []Param
	Buckets []Bucket
	// Where maps a parameter index to its bucket index and slot index.
	Where [][2]int
}

// reducibleDTypes are the dtypes the collective engines sum.
var reducibleDTypes = map[dtypes.DType]bool{dtypes.Float32: true, dtypes.Float64: true}

// NewPlan lays params out in buckets. Params are given in registration order (the order the model created
// them) and planned in reverse, the order backward produces their gradients. Each dtype gets its own
// buckets; the first bucket of each dtype is capped at firstBucketBytes and later ones at bucketCapBytes.
// A parameter larger than the cap gets a bucket of its own. Buckets are ordered by when their first
// gradient becomes ready. A firstBucketBytes of zero or less means DefaultFirstBucketBytes; either way the
// first bucket is never allowed to be larger than bucketCapBytes.
func NewPlan(params []Param, firstBucketBytes, bucketCapBytes int64) (Plan, error) {
	if bucketCapBytes <= 0 {
		return Plan{}, fmt.Errorf("accumulate: bucket cap must be positive, got %d bytes", bucketCapBytes)
	}
	if firstBucketBytes <= 0 {
		firstBucketBytes = DefaultFirstBucketBytes
	}
	firstBucketBytes = min(firstBucketBytes, bucketCapBytes)
	// The plan keeps its own copy: Signature must describe the layout the buckets were planned for even if
	// the caller reuses its slice.
	params = slices.Clone(params)
	plan := Plan{Params: params, Where: make([][2]int, len(params))}
	open := map[dtypes.DType]int{}    // dtype → index of its open bucket
	closed := map[dtypes.DType]bool{} // dtype → whether it already closed a bucket (so the first cap is spent)
	for i := len(params) - 1; i >= 0; i-- {
		p := params[i]
		dtype := p.Shape.DType
		if !reducibleDTypes[dtype] {
			return Plan{}, fmt.Errorf("accumulate: trainable variable %q has dtype %s; gradients can be "+
				"synchronised for float32 and float64 variables", p.Name, dtype)
		}
		size := p.Shape.Size()
		bytes := int64(size * dtype.Size())
		capBytes := bucketCapBytes
		if !closed[dtype] {
			capBytes = firstBucketBytes
		}
		b, ok := open[dtype]
		if ok && int64(plan.Buckets[b].Bytes())+bytes > capBytes && plan.Buckets[b].Size > 0 {
			closed[dtype] = true
			ok = false
		}
		if !ok {
			plan.Buckets = append(plan.Buckets, Bucket{DType: dtype})
			b = len(plan.Buckets) - 1
			open[dtype] = b
		}
		bucket := &plan.Buckets[b]
		plan.Where[i] = [2]int{b, len(bucket.Slots)}
		bucket.Slots = append(bucket.Slots, Slot{Param: i, Offset: bucket.Size, Size: size})
		bucket.Size += size
	}
	return plan, nil
}

// Signature is a stable text describing the plan: parameter names, shapes, dtypes and bucket layout. Ranks
// compare it before exchanging anything, because mismatched layouts would silently sum unrelated numbers.
func (p Plan) Signature() []string {
	lines := make([]string, 0, len(p.Params)+len(p.Buckets))
	for i, param := range p.Params {
		lines = append(lines, fmt.Sprintf("param %d %s %s", i, param.Name, param.Shape))
	}
	for i, b := range p.Buckets {
		var slots strings.Builder
		for _, s := range b.Slots {
			fmt.Fprintf(&slots, " %d@%d+%d", s.Param, s.Offset, s.Size)
		}
		lines = append(lines, fmt.Sprintf("bucket %d %s %d:%s", i, b.DType, b.Size, slots.String()))
	}
	return lines
}

// TotalBytes is the sum of all buckets' sizes.
func (p Plan) TotalBytes() int64 {
	var n int64
	for _, b := range p.Buckets {
		n += int64(b.Bytes())
	}
	return n
}
