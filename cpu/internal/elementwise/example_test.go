package elementwise_test

import (
	"fmt"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/cpu/internal/elementwise"
)

// A bias added to channels-last activations, then ReLU: the broadcast runs as block loops and ReLU compares
// with a scalar zero, with simplego's results.
func Example() {
	if err := elementwise.Install(); err != nil {
		fmt.Println(err)
		return
	}
	defer elementwise.Uninstall()
	// One operation at a time: simplego's parallel scheduler races on its own bookkeeping, which
	// `go test -race` reports (docs/notes.md, Note [simplego's parallel scheduler]).
	inner, err := simplego.New("ops_sequential")
	if err != nil {
		fmt.Println(err)
		return
	}
	backend := elementwise.Extend(inner)
	defer backend.Finalize()

	before := elementwise.Calls().Broadcasts
	activations := tensors.FromFlatDataAndDimensions([]float32{-1, 2, 3, -4, 5, -6}, 1, 3, 2)
	bias := tensors.FromFlatDataAndDimensions([]float32{0.5, -0.5}, 1, 1, 2)
	out := graph.MustExecOnce(backend, func(x, b *graph.Node) *graph.Node {
		y := graph.Add(x, b)
		return graph.Max(y, graph.ZerosLike(y))
	}, activations, bias)
	fmt.Println(out.Value())
	fmt.Println(elementwise.Calls().Broadcasts - before)
	// Output:
	// [[[0 1.5] [3.5 0] [5.5 0]]]
	// 1
}
