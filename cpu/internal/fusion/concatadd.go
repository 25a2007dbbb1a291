package fusion

import (
	"fmt"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
	"github.com/goaccel/goaccel/cpu/internal/threads"
	"github.com/goaccel/goaccel/internal/vec32"
)

// Concatenate-and-add: a training step adds each micro-batch's gradients into flat bucket accumulators as
// Add(accumulator, Concatenate(Reshape(gradient)…)) (one flat vector per bucket, see bucketgraph.Flatten).
// simplego copies every gradient into a fresh concatenated buffer and the Add then reads that copy again:
// a pass over every gradient byte, per micro-batch, that only moves data. The Add is rewritten here into a
// node that adds each gradient straight into its slice of the sum, reading the gradients where they are
// (a Reshape of a flat vector is the same row-major data). IEEE addition is exactly rounded and
// commutative, so every element is the bit the Add would have computed.

// concatAddsOn turns the rewrite on; benchmarks turn it off to measure the copy it removes.
var concatAddsOn = true

// concatAddKernel is acc + Concatenate(parts, axis 0) of float32 vectors. Inputs: acc, then the parts. acc
// may be a scalar (an accumulator known to hold zeros is not read: the step adds the constant 0 instead).
type concatAddKernel struct {
	shape  shapes.Shape // of the result
	size   int          // elements of the result
	sizes  []int        // elements of each part, in order
	scalar bool         // acc is one value, added to every element
}

func (k *concatAddKernel) name() string { return "concatenate-and-add" }

// parallelConcatAdd is the result size from which the additions are split over the compute threads: below
// it the hand-over costs more than half a memory-bound pass saves.
const parallelConcatAdd = 1 << 16

func (k *concatAddKernel) run(backend *simplego.Backend, inputs []*simplego.Buffer, inputsOwned []bool) (*simplego.Buffer, error) {
	if len(inputs) != 1+len(k.sizes) {
		return nil, fmt.Errorf("fusion: %s: %d inputs, want %d", k.name(), len(inputs), 1+len(k.sizes))
	}
	owned := inputsOwned
	if k.scalar {
		owned = make([]bool, len(inputs)) // the scalar's buffer cannot take the result
	}
	data, output, out, err := rowBuffers(backend, k.name(), k.shape, inputs, owned, 0)
	if err != nil {
		return nil, err
	}
	acc := data[0].([]float32)
	parts := make([][]float32, len(k.sizes))
	for i := range parts {
		parts[i] = data[1+i].([]float32)
	}
	// addRange adds the parts' elements [lo, hi) of the concatenation into out.
	addRange := func(lo, hi int) {
		start := 0
		for _, part := range parts {
			end := start + len(part)
			if a, b := max(lo, start), min(hi, end); a < b {
				if k.scalar {
					vec32.BinaryScalar(vec32.Add, out[a:b], part[a-start:b-start], acc[0])
				} else {
					vec32.Binary(vec32.Add, out[a:b], acc[a:b], part[a-start:b-start])
				}
			}
			start = end
		}
	}
	workers := min(threads.Budget(), k.size/(parallelConcatAdd/2))
	if k.size < parallelConcatAdd || workers < 2 {
		addRange(0, k.size)
		return output, nil
	}
	// Ranges of whole multiples of 16 elements: parts meet on 64-byte boundaries when the output starts on
	// one (as Go's allocations of this size do), so no two threads write the same cache line.
	per := ((k.size+workers-1)/workers + 15) &^ 15
	threads.Split(workers, func(w int) {
		end := min((w+1)*per, k.size)
		if w == workers-1 {
			end = k.size
		}
		addRange(min(w*per, k.size), end)
	})
	return output, nil
}

// matchConcatAdd recognises Add(acc, Concatenate(parts, 0)) (either operand order) of float32 vectors, acc a
// vector of the result's size or a scalar, and returns the accumulator and the concatenation.
func matchConcatAdd(node *simplego.Node) (acc, concat *simplego.Node, ok bool) {
	in, ok := is(node, backends.OpTypeAdd, 2)
	if !ok {
		return nil, nil, false
	}
	shape := shapeOf(node)
	if shape.DType != dtypes.Float32 || shape.Rank() != 1 {
		return nil, nil, false
	}
	for i, operand := range in {
		parts, ok := is(operand, backends.OpTypeConcatenate, len(gomlxpatch.NodeInputs(operand)))
		if !ok || len(parts) < 2 {
			continue
		}
		if axis, ok := gomlxpatch.NodeData(operand).(int); !ok || axis != 0 {
			continue
		}
		other := in[1-i]
		if s := shapeOf(other); s.DType != dtypes.Float32 || (s.Size() != 1 && (s.Rank() != 1 || s.Size() != shape.Size())) {
			continue
		}
		return other, operand, true
	}
	return nil, nil, false
}

// rewriteConcatAdds rewrites every concatenate-and-add of the graph computing outputs whose concatenation
// nothing else reads into a concatAddKernel, and returns how many it rewrote.
func rewriteConcatAdds(outputs []*simplego.Node) (int, error) {
	g := newGraph(outputs)
	rewritten := 0
	for _, node := range g.order {
		acc, concat, ok := matchConcatAdd(node)
		if !ok || g.isOutput[concat] || len(g.consumers[concat]) != 1 {
			continue
		}
		concatParts := gomlxpatch.NodeInputs(concat)
		shape := shapeOf(node)
		kernel := &concatAddKernel{shape: shape, size: shape.Size(), sizes: make([]int, len(concatParts)),
			scalar: shapeOf(acc).Size() == 1 && shape.Size() != 1}
		inputs := []*simplego.Node{acc}
		for i, part := range concatParts {
			// A reshape keeps the row-major order of the elements: read the gradient where it is.
			kernel.sizes[i] = shapeOf(part).Size()
			inputs = append(inputs, throughReshapes(part))
		}
		if err := gomlxpatch.Rewrite(node, fusedOpType, inputs, kernel); err != nil {
			return rewritten, err
		}
		rewritten++
	}
	return rewritten, nil
}
