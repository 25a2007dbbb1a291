package gemmgrad_test

import (
	"fmt"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/graph"

	"github.com/goaccel/goaccel/cpu/internal/gemmgrad"
)

// ExampleRegister differentiates a tiny dense layer with the gemm gradients installed: the gradient of
// the sum of x·w with respect to w is, for each output, the column sums of x.
func ExampleRegister() {
	gemmgrad.Register()
	defer gemmgrad.Unregister()

	// One operation at a time: simplego's parallel scheduler races on its own bookkeeping, which
	// `go test -race` reports (docs/notes.md, Note [simplego's parallel scheduler]).
	backend, err := simplego.New("ops_sequential")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer backend.Finalize()

	x := [][]float32{{1, 2, 3}, {4, 5, 6}}
	w := [][]float32{{1, 0}, {0, 1}, {1, 1}}
	gradient, err := graph.ExecOnce(backend, func(x, w *graph.Node) *graph.Node {
		loss := graph.ReduceAllSum(graph.Dot(x, w))
		return graph.Gradient(loss, w)[0]
	}, x, w)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(gemmgrad.Registered(), gradient.Value())
	// Output: true [[5 5] [7 7] [9 9]]
}
