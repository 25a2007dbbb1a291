package blas_test

import (
	"fmt"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/graph"

	"github.com/goaccel/goaccel/cpu/internal/blas"
)

// Install once at start-up, before executing graphs; every simplego backend in the process then runs its
// matrix products on the gemm kernel (OpenBLAS with the blas build tag, gonum without).
func Example() {
	if err := blas.Install(1); err != nil {
		fmt.Println("kernel not installed, simplego's own kernel stays:", err)
	}
	defer blas.Uninstall()

	backend, err := simplego.New("")
	if err != nil {
		panic(err)
	}
	defer backend.Finalize()

	matmul := graph.MustNewExec(backend, graph.Dot)
	defer matmul.Finalize()
	product := matmul.MustExec1([][]float32{{1, 2, 3}, {4, 5, 6}}, [][]float32{{7, 8}, {9, 10}, {11, 12}})
	fmt.Println(blas.Installed(), product.Value())
	// Output: true [[58 64] [139 154]]
}

// Gemm multiplies row-major matrices on the kernel the binary links, here [2,3]·[3,2] with the left
// operand stored transposed.
func ExampleGemm() {
	aTransposed := []float32{1, 4, 2, 5, 3, 6} // [3,2], the transpose of [[1 2 3] [4 5 6]]
	b := []float32{7, 8, 9, 10, 11, 12}        // [3,2]
	c := make([]float32, 4)
	blas.Gemm(2, 2, 3, true, false, aTransposed, b, c)
	fmt.Println(c)
	// Output: [58 64 139 154]
}
