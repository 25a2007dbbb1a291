package indexing_test

import (
	"fmt"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/cpu/internal/indexing"
)

// An embedding lookup and its gradient: the gather copies whole rows of the table, and the gradient adds
// each row of weights back into the row it came from (row 1, picked twice, gets both).
func Example() {
	if err := indexing.Install(); err != nil {
		fmt.Println(err)
		return
	}
	defer indexing.Uninstall()
	// One operation at a time: simplego's parallel scheduler races on its own bookkeeping, which
	// `go test -race` reports (docs/notes.md, Note [simplego's parallel scheduler]).
	backend, err := simplego.New("ops_sequential")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer backend.Finalize()

	before := indexing.Calls()
	table := tensors.FromValue([][]float32{{0, 0.5}, {1, 1.5}, {2, 2.5}})
	tokens := tensors.FromValue([][]int32{{1}, {2}, {1}})
	weights := tensors.FromValue([][]float32{{1, 2}, {3, 4}, {5, 6}})
	out := graph.MustExecOnceN(backend, func(table, tokens, weights *graph.Node) []*graph.Node {
		rows := graph.Gather(table, tokens)
		loss := graph.ReduceAllSum(graph.Mul(rows, weights))
		return []*graph.Node{rows, graph.Gradient(loss, table)[0]}
	}, table, tokens, weights)
	fmt.Println(out[0].Value())
	fmt.Println(out[1].Value())
	after := indexing.Calls()
	fmt.Println(after.Gathers-before.Gathers, after.Scatters-before.Scatters)
	// Output:
	// [[1 1.5] [2 2.5] [1 1.5]]
	// [[0 0] [6 8] [3 4]]
	// 1 1
}
