package extraops_test

import (
	"fmt"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/cpu/internal/extraops"
)

// Padding on GoMLX's pure-Go backend, and its gradient: Extend adds the op to the builder, Install its
// executor, RegisterGradients the gradient GoMLX lacks (cpu.New does all three).
func ExampleExtend() {
	if err := extraops.Install(); err != nil {
		fmt.Println(err)
		return
	}
	extraops.RegisterGradients()
	inner, err := simplego.New("ops_sequential")
	if err != nil {
		fmt.Println(err)
		return
	}
	backend := extraops.Extend(inner)
	x := tensors.FromValue([]float32{1, 2, 3})
	pad := func(x *graph.Node) *graph.Node {
		// One zero between elements, two before, the last element cut.
		return graph.Pad(x, graph.ScalarZero(x.Graph(), dtypes.Float32), backends.PadAxis{Start: 2, End: -1, Interior: 1})
	}
	padded, err := graph.ExecOnce(backend, pad, x)
	if err != nil {
		fmt.Println(err)
		return
	}
	// The gradient of Σ i·padded[i]: each element's position in the padded vector.
	gradient, err := graph.ExecOnce(backend, func(x *graph.Node) *graph.Node {
		y := pad(x)
		return graph.Gradient(graph.ReduceAllSum(graph.Mul(y, graph.Iota(x.Graph(), y.Shape(), 0))), x)[0]
	}, x)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(padded.Value(), gradient.Value())
	// Output: [0 0 1 0 2 0] [2 4 0]
}
