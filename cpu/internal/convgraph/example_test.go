package convgraph_test

import (
	"fmt"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/cpu/internal/convgraph"
)

// Differentiating a convolution on the pure-Go backend: without Register, this fails with
// `op "Reverse" not implemented in SimpleGo yet`.
func ExampleRegister() {
	convgraph.Register()
	defer convgraph.Unregister()

	// One operation at a time: simplego's parallel scheduler races on its own bookkeeping, which
	// `go test -race` reports (docs/notes.md, Note [simplego's parallel scheduler]).
	backend, err := simplego.New("ops_sequential")
	if err != nil {
		fmt.Println(err)
		return
	}
	// The gradient of the sum of a 2×2 convolution (VALID padding) of a 3×3 image with respect to the
	// image: how many windows read each pixel.
	gradient, err := graph.ExecOnce(backend, func(image *graph.Node) *graph.Node {
		kernel := graph.Ones(image.Graph(), shapes.Make(dtypes.Float32, 2, 2, 1, 1)) // [height, width, in, out]
		output := graph.Convolve(image, kernel).Strides(1).NoPadding().Done()
		return graph.Gradient(graph.ReduceAllSum(output), image)[0]
	}, tensors.FromValue([][][][]float32{{{{1}, {2}, {3}}, {{4}, {5}, {6}}, {{7}, {8}, {9}}}}))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(convgraph.Registered())
	fmt.Println(tensors.MustCopyFlatData[float32](gradient))
	// Output:
	// true
	// [1 2 1 2 4 2 1 2 1]
}

// Setting up the pure-Go backend to train convolutional models: Register for the gradients, and
// LowerConvolutions for convolutions and poolings built from fast ops. Models are written as usual, here a
// convolution and a max-pooling as layers.Convolution and graph.MaxPool build them.
func ExampleLowerConvolutions() {
	convgraph.Register()
	defer convgraph.Unregister()
	// One operation at a time: simplego's parallel scheduler races on its own bookkeeping, which
	// `go test -race` reports (docs/notes.md, Note [simplego's parallel scheduler]).
	pureGo, err := simplego.New("ops_sequential")
	if err != nil {
		fmt.Println(err)
		return
	}
	backend := convgraph.LowerConvolutions(pureGo)

	trainStep, err := graph.NewExec(backend, func(images, kernel *graph.Node) (pooled, imagesGradient, kernelGradient *graph.Node) {
		features := graph.Convolve(images, kernel).Strides(1).PadSame().Done()
		pooled = graph.MaxPool(features).Window(2).Done()
		gradients := graph.Gradient(graph.ReduceAllSum(graph.Square(pooled)), images, kernel)
		return pooled, gradients[0], gradients[1]
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer trainStep.Finalize()
	outputs, err := trainStep.Exec(tensors.FromShape(shapes.Make(dtypes.Float32, 8, 28, 28, 1)),
		tensors.FromShape(shapes.Make(dtypes.Float32, 3, 3, 1, 16)))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, t := range outputs {
		fmt.Println(t.Shape())
	}
	// Output:
	// (Float32)[8 14 14 16]
	// (Float32)[8 28 28 1]
	// (Float32)[3 3 1 16]
}
