// Package ready lets a graph of GoMLX's pure-Go backend (simplego, GoMLX v0.26.0) tell the program, while
// it executes, that one of its values is computed: a training step hands each bucket of gradients to the
// communicator as soon as the backward pass has produced it, and the bucket's all-reduce runs while the
// rest of the backward does (docs/overlap.md).
//
// A marked value is a node of its own op type (readyOpType, which simplego does not implement) whose
// executor passes its input's buffer through unchanged — the same memory, so what the program starts
// reducing is what the graph outputs — and calls the node's function with that buffer's data. simplego's
// sequential executor runs nodes in the order they were built, and a training step builds the additions
// of the gradients into their buckets after the whole backward pass; so the builder Extend returns
// reorders the graph when it compiles, each marked node and what it depends on first, in the order of the
// marks (gomlxpatch.ScheduleFirst).
package ready

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe" // To read graph.Node's backend op, which GoMLX does not export.

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/graph"

	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// readyOpType is the op type of marked nodes: one simplego has no executor for (Install refuses to replace
// one) and that names what the node is for, the start of an all-reduce.
const readyOpType = backends.OpTypeAllReduce

// readyData is a marked node's parameters.
type readyData struct {
	index int
	ready func(flat any, loss float64)
}

var (
	installMu sync.Mutex
	patch     = &gomlxpatch.ExecutorPatch{OpType: readyOpType, Executor: execReady}

	marked, reordered, calls atomic.Uint64
)

// Counts says what this package did since the process started; tests use it to check that its paths ran.
type Counts struct {
	Marked    uint64 // nodes marked
	Reordered uint64 // graphs whose execution order changed when they compiled
	Calls     uint64 // executions of marked nodes
}

// Calls returns the counts so far.
func Calls() Counts {
	return Counts{Marked: marked.Load(), Reordered: reordered.Load(), Calls: calls.Load()}
}

// Install puts the marked nodes' executor in simplego's table. It is idempotent, and must not run
// concurrently with executions.
func Install() error {
	installMu.Lock()
	defer installMu.Unlock()
	if patch.Installed() {
		return nil
	}
	replaced, err := patch.Install()
	if err == nil && replaced != nil {
		patch.Uninstall()
		err = fmt.Errorf("simplego has its own %s executor (GoMLX internals changed; written against GoMLX "+
			"v0.26.0)", readyOpType)
	}
	if err != nil {
		return fmt.Errorf("ready: %w", err)
	}
	return nil
}

// Uninstall removes the executor: graphs marked afterwards are not (MarkReady returns x), and graphs
// marked before must not run.
func Uninstall() {
	installMu.Lock()
	defer installMu.Unlock()
	patch.Uninstall()
}

// Installed reports whether marked nodes can run.
func Installed() bool { return patch.Installed() }

// MarkReady implements cpu.ReadyMarker.MarkReady.
func MarkReady(x, loss *graph.Node, index int, ready func(flat any, loss float64)) (*graph.Node, bool) {
	if !Installed() {
		return x, false
	}
	xOp, okX := simplegoOp(x)
	lossOp, okLoss := simplegoOp(loss)
	if !okX || !okLoss || !loss.Shape().IsScalar() {
		return x, false
	}
	// A node of the graph with its own backend op, of x's shape, whose op is then turned into the marked
	// one: GoMLX's graph package builds only the ops it knows.
	y := graph.Identity(x)
	yOp, ok := simplegoOp(y)
	if !ok {
		return x, false
	}
	if err := gomlxpatch.Rewrite(yOp, readyOpType, []*simplego.Node{xOp, lossOp},
		&readyData{index: index, ready: ready}); err != nil {
		return x, false
	}
	marked.Add(1)
	return y, true
}

var (
	outputOpsOnce   sync.Once
	outputOpsOffset uintptr
	outputOpsErr    error
)

// simplegoOp is the simplego node behind a graph node: its only backend op (graph.Node.outputOps, read
// through its offset, checked once), when that is a simplego node.
func simplegoOp(n *graph.Node) (*simplego.Node, bool) {
	outputOpsOnce.Do(func() {
		field, found := reflect.TypeFor[graph.Node]().FieldByName("outputOps")
		if !found || field.Type != reflect.TypeFor[[]backends.Op]() {
			outputOpsErr = errors.New("graph.Node has no field outputOps of type []backends.Op (GoMLX internals " +
				"changed; written against GoMLX v0.26.0)")
			return
		}
		outputOpsOffset = field.Offset
	})
	if outputOpsErr != nil || n == nil {
		return nil, false
	}
	ops := *(*[]backends.Op)(unsafe.Add(unsafe.Pointer(n), outputOpsOffset))
	if len(ops) != 1 {
		return nil, false
	}
	node, ok := ops[0].(*simplego.Node)
	return node, ok && node != nil
}

// execReady passes its input's buffer through and calls the node's function with it.
func execReady(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	data, ok := gomlxpatch.NodeData(node).(*readyData)
	if !ok || len(inputs) != 2 {
		return nil, errors.New("ready: a marked node without its parameters")
	}
	out := inputs[0]
	if inputsOwned[0] {
		// The buffer becomes this node's result: simplego must not free it as an input it used up.
		inputs[0] = nil
	} else {
		// Another node still reads it (it is never so in a training step, where the value is only output):
		// the program gets a copy of its own, which is what the graph outputs.
		flat, err := backend.BufferData(out)
		if err != nil {
			return nil, err
		}
		shape, err := backend.BufferShape(out)
		if err != nil {
			return nil, err
		}
		copied, err := backend.BufferFromFlatData(0, flat, shape)
		if err != nil {
			return nil, err
		}
		if out, ok = copied.(*simplego.Buffer); !ok {
			return nil, fmt.Errorf("ready: simplego made a %T", copied)
		}
	}
	flat, err := backend.BufferData(out)
	if err != nil {
		return nil, err
	}
	lossFlat, err := backend.BufferData(inputs[1])
	if err != nil {
		return nil, err
	}
	var loss float64
	switch l := lossFlat.(type) {
	case []float64:
		loss = l[0]
	case []float32:
		loss = float64(l[0])
	default:
		return nil, fmt.Errorf("ready: the loss is a %T, want a float scalar", lossFlat)
	}
	calls.Add(1)
	data.ready(flat, loss)
	return out, nil
}

// Extend returns a backend that is inner (GoMLX's pure-Go backend, possibly extended by goaccel's other
// wrappers) whose builders, when they compile a graph with marked nodes, reorder it so that each marked
// node runs as early as its inputs allow. It must be inside any wrapper that rewrites the graph when it
// compiles (fusion), so that it orders the graph as it will run.
func Extend(inner backends.Backend) backends.Backend { return &readyBackend{Backend: inner} }

// readyBackend is a pointer type so that backends compare by identity.
type readyBackend struct{ backends.Backend }

func (b *readyBackend) Builder(name string) backends.Builder {
	return &readyBuilder{Builder: b.Backend.Builder(name)}
}

type readyBuilder struct{ backends.Builder }

// Compile reorders the graph for its marked nodes, then compiles it as inner does.
func (b *readyBuilder) Compile(outputs []backends.Op, shardings []*backends.ShardingSpec) (backends.Executable, error) {
	if Installed() && len(shardings) == 0 {
		if marks := markedNodes(outputs); len(marks) > 0 {
			changed, err := gomlxpatch.ScheduleFirst(marks)
			if err != nil {
				return nil, fmt.Errorf("ready: %w", err)
			}
			if changed {
				reordered.Add(1)
			}
		}
	}
	return b.Builder.Compile(outputs, shardings)
}

// markedNodes are the marked nodes the outputs depend on, in the order of their indices.
func markedNodes(outputs []backends.Op) []*simplego.Node {
	var (
		marks []*simplego.Node
		stack []*simplego.Node
		seen  = map[*simplego.Node]bool{}
	)
	for _, op := range outputs {
		node, ok := op.(*simplego.Node)
		if !ok || node == nil {
			return nil
		}
		stack = append(stack, node)
	}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[n] {
			continue
		}
		seen[n] = true
		if opType, ok := gomlxpatch.NodeOpType(n); ok && opType == readyOpType {
			if _, ok := gomlxpatch.NodeData(n).(*readyData); ok {
				marks = append(marks, n)
			}
		}
		stack = append(stack, gomlxpatch.NodeInputs(n)...)
	}
	slices.SortStableFunc(marks, func(a, b *simplego.Node) int {
		return cmp.Compare(gomlxpatch.NodeData(a).(*readyData).index, gomlxpatch.NodeData(b).(*readyData).index)
	})
	return marks
}
