package convkernel_test

import (
	"fmt"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/cpu/internal/convkernel"
)

// A convolution and a max pooling on the extended pure-Go backend run on the kernels once installed.
func Example() {
	if err := convkernel.Install(); err != nil {
		fmt.Println(err)
		return
	}
	defer convkernel.Uninstall()
	// One operation at a time: simplego's parallel scheduler races on its own bookkeeping, which
	// `go test -race` reports (docs/notes.md, Note [simplego's parallel scheduler]).
	inner, err := simplego.New("ops_sequential")
	if err != nil {
		fmt.Println(err)
		return
	}
	backend := convkernel.Extend(inner)
	defer backend.Finalize()

	before := convkernel.Calls()
	// A 1×4×4×1 image of 0..15, a 2×2 kernel of ones (sums of windows), then 2×2 max pooling.
	image := tensors.FromFlatDataAndDimensions([]float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, 1, 4, 4, 1)
	kernel := tensors.FromFlatDataAndDimensions([]float32{1, 1, 1, 1}, 2, 2, 1, 1)
	pooled := graph.MustExecOnce(backend, func(x, k *graph.Node) *graph.Node {
		sums := graph.Convolve(x, k).Strides(1).PadSame().Done()
		return graph.MaxPool(sums).Window(2).Done()
	}, image, kernel)
	after := convkernel.Calls()
	fmt.Println(pooled.Value())
	fmt.Println(after.Convolutions-before.Convolutions, after.Pools-before.Pools)
	// Output:
	// [[[[30] [34]] [[46] [50]]]]
	// 1 1
}
