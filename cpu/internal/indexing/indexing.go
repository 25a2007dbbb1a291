// Package indexing speeds up Gather, ScatterSum and Slice on GoMLX's pure-Go backend (simplego) where they
// move whole rows, the way every language model uses the first two and every prepared model's update the
// third:
//
//   - an embedding lookup gathers a table's rows by token id, and its gradient scatter-adds the rows of
//     the output's gradient back into a table of zeros;
//   - a sparse loss picks one logit per position by label (a gather of single elements of a flattened
//     table), and its gradient scatters one value per position;
//   - a slice whose innermost axis is taken with stride 1 reads contiguous runs of its operand (a
//     parameter's part of a flat gradient bucket is one run).
//
// simplego walks them through per-axis index iterators and copies or adds one element per step. Here a
// row is one copy or one loop of adds. Gathers, scatters and slices of any other layout, and index or data types
// this package does not list, fall back on simplego's own executors. Results are bitwise the same:
// rows are added in the order of their indices, element by element, as simplego adds them. Index
// bounds follow XLA: a gather clamps an out-of-range index into the table, and a scatter skips an update
// whose index is out of range (simplego's own scatter does not check).
//
// Install patches simplego's executor table through the same internals as the blas, elementwise and
// convkernel packages.
package indexing

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

var (
	installMu sync.Mutex
	patches   = []*gomlxpatch.ExecutorPatch{
		{OpType: backends.OpTypeGather, Executor: execGather},
		{OpType: backends.OpTypeScatterSum, Executor: execScatterSum},
		{OpType: backends.OpTypeSlice, Executor: execSlice},
	}
	// fallbacks holds simplego's own executor per op type, found at Install.
	fallbacks [backends.OpTypeLast]gomlxpatch.Executor

	gatherCalls, scatterCalls, sliceCalls atomic.Uint64
)

// Install routes simplego's Gather, ScatterSum and Slice through this package. It is idempotent, and must not
// run concurrently with executions (simplego reads its executor table without synchronization).
func Install() error {
	installMu.Lock()
	defer installMu.Unlock()
	err := gomlxpatch.InstallReplacing(patches, func(opType backends.OpType, replaced gomlxpatch.Executor) {
		fallbacks[opType] = replaced
	})
	if err != nil {
		return fmt.Errorf("indexing: %w", err)
	}
	return nil
}

// Uninstall restores simplego's executors.
func Uninstall() {
	installMu.Lock()
	defer installMu.Unlock()
	gomlxpatch.UninstallAll(patches)
}

// Installed reports whether the executors are in simplego's table.
func Installed() bool {
	installMu.Lock()
	defer installMu.Unlock()
	return patches[0].Installed()
}

// Counts says how many gathers and scatters this package computed since the process started (the rest
// ran on simplego's executors).
type Counts struct {
	Gathers, Scatters, Slices uint64
}

// Calls returns the operations computed so far.
func Calls() Counts {
	return Counts{Gathers: gatherCalls.Load(), Scatters: scatterCalls.Load(), Slices: sliceCalls.Load()}
}

// execGather runs a gather of whole rows as one copy per index.
func execGather(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	if output, ok := gatherRows(backend, node, inputs); ok {
		gatherCalls.Add(1)
		return output, nil
	}
	return fallbacks[backends.OpTypeGather](backend, node, inputs, inputsOwned)
}

// execScatterSum runs a scatter-add of whole rows as one loop of adds per index.
func execScatterSum(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	if output, ok := scatterRows(backend, node, inputs, inputsOwned); ok {
		scatterCalls.Add(1)
		return output, nil
	}
	return fallbacks[backends.OpTypeScatterSum](backend, node, inputs, inputsOwned)
}

// execSlice runs a slice whose elements lie in contiguous runs of the operand as one copy per run.
func execSlice(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	if output, ok := sliceRuns(backend, node, inputs); ok {
		sliceCalls.Add(1)
		return output, nil
	}
	return fallbacks[backends.OpTypeSlice](backend, node, inputs, inputsOwned)
}

// newOutput allocates a buffer of shape and returns it with its flat data, or false when either fails.
func newOutput(backend *simplego.Backend, shape shapes.Shape) (*simplego.Buffer, any, bool) {
	output := backend.NewBuffer(shape)
	if output == nil {
		return nil, nil, false
	}
	data, err := backend.BufferData(output)
	if err != nil {
		return nil, nil, false
	}
	return output, data, true
}

// shapesOf returns the shapes of the buffers, and false if one cannot be read.
func shapesOf(backend *simplego.Backend, buffers []*simplego.Buffer) ([]shapes.Shape, bool) {
	out := make([]shapes.Shape, len(buffers))
	for i, b := range buffers {
		s, err := backend.BufferShape(b)
		if err != nil {
			return nil, false
		}
		out[i] = s
	}
	return out, true
}
