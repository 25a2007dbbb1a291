// Package bucketgraph is the graph-building side of a bucket plan: it lays a model's gradients out as one
// flat node per bucket inside the training step, and slices the buckets back into per-parameter gradients
// inside the optimizer's update. Only goaccel's prepared models and optimizers build these graphs.
package bucketgraph

import (
	"fmt"

	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.

	"github.com/goaccel/goaccel/accumulate"
)

// Flatten lays gradients (indexed like Plan.Params) out as one flat node per bucket. It is
// graph-building code: it panics on misuse, and the executor recovers that into an error.
func Flatten(p accumulate.Plan, grads []*Node) []*Node {
	if len(grads) != len(p.Params) {
		panic(fmt.Sprintf("bucketgraph: %d gradients for a plan of %d parameters", len(grads), len(p.Params)))
	}
	flats := make([]*Node, len(p.Buckets))
	for b, bucket := range p.Buckets {
		parts := make([]*Node, len(bucket.Slots))
		for s, slot := range bucket.Slots {
			g := grads[slot.Param]
			if !g.Shape().Equal(p.Params[slot.Param].Shape) {
				panic(fmt.Sprintf("bucketgraph: gradient of %q has shape %s, the plan expects %s",
					p.Params[slot.Param].Name, g.Shape(), p.Params[slot.Param].Shape))
			}
			parts[s] = Reshape(g, slot.Size)
		}
		if len(parts) == 1 {
			flats[b] = parts[0]
		} else {
			flats[b] = Concatenate(parts, 0)
		}
	}
	return flats
}

// Unflatten is the inverse of Flatten: it slices flat bucket nodes back into one node per
// parameter, shaped like it.
func Unflatten(p accumulate.Plan, buckets []*Node) []*Node {
	if len(buckets) != len(p.Buckets) {
		panic(fmt.Sprintf("bucketgraph: %d bucket nodes for a plan of %d buckets", len(buckets), len(p.Buckets)))
	}
	grads := make([]*Node, len(p.Params))
	for b, bucket := range p.Buckets {
		for _, slot := range bucket.Slots {
			part := buckets[b]
			if len(bucket.Slots) > 1 {
				part = Slice(part, AxisRange(slot.Offset, slot.Offset+slot.Size))
			}
			grads[slot.Param] = Reshape(part, p.Params[slot.Param].Shape.Dimensions...)
		}
	}
	return grads
}
