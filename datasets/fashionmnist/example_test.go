package fashionmnist_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/datasets/fashionmnist"
	"github.com/goaccel/goaccel/internal/testing/idxtest"
)

// Loading the dataset. Real code passes fashionmnist.DefaultDir, where
// `apt-get install dataset-fashion-mnist` puts the files; this example
// writes a tiny stand-in (4 training and 2 test images) so it runs anywhere.
func ExampleLoad() {
	dir, _ := os.MkdirTemp("", "fashion-mnist")
	defer os.RemoveAll(dir)
	write := func(name string, dims []int, data []uint8) {
		_ = os.WriteFile(filepath.Join(dir, name), idxtest.Gzip(idxtest.Encode(dims, data)), 0o644)
	}
	write("train-images-idx3-ubyte.gz", []int{4, 28, 28}, make([]uint8, 4*784))
	write("train-labels-idx1-ubyte.gz", []int{4}, []uint8{9, 0, 0, 3})
	write("t10k-images-idx3-ubyte.gz", []int{2, 28, 28}, make([]uint8, 2*784))
	write("t10k-labels-idx1-ubyte.gz", []int{2}, []uint8{1, 7})

	train, test, err := fashionmnist.Load(dir, fashionmnist.Limit(3))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(train.Images.Shape(), train.Labels.Shape())
	fmt.Println(test.Images.Shape(), test.Labels.Shape())
	first := tensors.MustCopyFlatData[int32](train.Labels)[0]
	fmt.Println(fashionmnist.ClassNames[first])
	// Output:
	// (Uint8)[3 784] (Int32)[3 1]
	// (Uint8)[2 784] (Int32)[2 1]
	// Ankle boot
}

// Pixels stay bytes in memory; a model scales them to [0, 1] in its graph.
func ExampleScale() {
	pixels := tensors.FromValue([][]uint8{{0, 51, 255}})
	scaled := graph.MustExecOnce(simplego.GetBackend(), fashionmnist.Scale, pixels)
	fmt.Printf("%.4f\n", tensors.MustCopyFlatData[float32](scaled))
	// Output: [0.0000 0.2000 1.0000]
}

// A missing dataset is reported with the command that installs it.
func ExampleLoad_notInstalled() {
	_, _, err := fashionmnist.Load("/nonexistent/fashion-mnist")
	fmt.Println(errors.Is(err, fashionmnist.ErrNotInstalled))
	fmt.Println(err)
	// Output:
	// true
	// fashionmnist: Fashion-MNIST dataset not found: directory /nonexistent/fashion-mnist does not exist (file does not exist); install it with `apt-get install dataset-fashion-mnist` (it puts the files in /usr/share/datasets/fashion-mnist), or pass the directory that holds train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz
}
