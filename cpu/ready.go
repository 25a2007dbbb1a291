package cpu

import (
	"github.com/gomlx/gomlx/pkg/core/graph"
)

// ReadyMarker is implemented by an Extension that can tell the program, while a graph executes, that one
// of its values has been computed: what lets a training step start a bucket's gradient sync while the rest
// of its backward pass runs (docs/overlap.md).
type ReadyMarker interface {
	// MarkReady returns a node equal to x whose execution calls ready with x's flat data (a Go slice the
	// program may read and write in place: it is the memory the graph outputs) and with the value of loss,
	// a scalar of the same graph, once x and loss are computed. The graph then computes x as early as its
	// inputs allow, in the order of index among the marked nodes. ok is false when this graph cannot be
	// marked (another backend, a builder the extension does not know): x is returned unchanged and ready is
	// never called.
	MarkReady(x, loss *graph.Node, index int, ready func(flat any, loss float64)) (y *graph.Node, ok bool)
}

// MarkReady is the registered extension's ReadyMarker.MarkReady: y equals x and, on the pure-Go backend
// with goaccel's kernels, calls ready(flat, loss) as soon as the executing graph has computed x (flat is
// x's data, the very memory the graph outputs as y). Elsewhere (XLA, GoMLX's own kernels when goaccel's
// stay off) it returns x itself and false, and ready is never called: the caller does after the graph
// returns what ready would have done during it.
//
// ready runs on the goroutine that executes the graph, in the middle of its execution: it must not block
// for long, and must not run graphs of its own.
func MarkReady(x, loss *graph.Node, index int, ready func(flat any, loss float64)) (*graph.Node, bool) {
	extensionMu.Lock()
	marker, ok := extension.(ReadyMarker)
	extensionMu.Unlock()
	if !ok || x == nil || loss == nil || ready == nil {
		return x, false
	}
	return marker.MarkReady(x, loss, index, ready)
}
