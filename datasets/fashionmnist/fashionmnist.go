// Package fashionmnist loads the Fashion-MNIST dataset (Zalando's 28×28
// grey-scale images of clothing in 10 classes, 60,000 for training and
// 10,000 for testing) as GoMLX tensors ready for training.
//
// The data is read from the four IDX files of the original distribution
// (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,
// t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz), gzip-compressed or
// not, in a local directory. Nothing is downloaded: on Debian and Ubuntu the
// files come with the package dataset-fashion-mnist, which installs them into
// [DefaultDir]:
//
//	apt-get install dataset-fashion-mnist
//
// Images are uint8 tensors of shape [N, 784] (each row a 28×28 image in
// row-major order) holding the files' pixel values, 0 to [MaxPixel]: a model
// converts them to floats in its graph (see [Scale]), so the dataset takes a
// quarter of the memory float32 pixels would, and a batch a quarter of the
// copying. Labels are int32 tensors of shape [N, 1], the layout
// losses.SparseCategoricalCrossEntropyLogits expects, with values in [0, 9]
// indexing [ClassNames].
package fashionmnist

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/datasets/idx"
)

// DefaultDir is where the Debian package [DebianPackage] installs the
// dataset.
const DefaultDir = "/usr/share/datasets/fashion-mnist"

// DebianPackage is the Debian/Ubuntu package that installs the dataset into
// [DefaultDir].
const DebianPackage = "dataset-fashion-mnist"

// Dimensions of the dataset.
const (
	Height     = 28
	Width      = 28
	ImageSize  = Height * Width // 784 features per example
	NumClasses = 10
	TrainSize  = 60000 // examples in the full training split
	TestSize   = 10000 // examples in the full test split
	MaxPixel   = 255   // the largest pixel value: white
)

// Scale converts a graph's uint8 pixels to float32 in [0, 1].
func Scale(pixels *graph.Node) *graph.Node {
	return graph.MulScalar(graph.ConvertDType(pixels, dtypes.Float32), 1.0/MaxPixel)
}

// ClassNames are the names of the 10 classes, indexed by label.
var ClassNames = [NumClasses]string{
	"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
	"Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
}

// Split selects the training or the test part of the dataset.
type Split int

// The two splits of Fashion-MNIST.
const (
	Train Split = iota // 60,000 examples, files train-*
	Test               // 10,000 examples, files t10k-*
)

// String returns "train" or "test".
func (s Split) String() string {
	switch s {
	case Train:
		return "train"
	case Test:
		return "test"
	}
	return fmt.Sprintf("Split(%d)", int(s))
}

// prefix is the file-name prefix of the split in the original distribution.
func (s Split) prefix() string {
	if s == Test {
		return "t10k"
	}
	return "train"
}

// ImagesFile and LabelsFile return the base names of the split's files as
// distributed, compressed (the loader also accepts them without ".gz").
func (s Split) ImagesFile() string { return s.prefix() + "-images-idx3-ubyte.gz" }

// LabelsFile: see [Split.ImagesFile].
func (s Split) LabelsFile() string { return s.prefix() + "-labels-idx1-ubyte.gz" }

// Dataset is one split of Fashion-MNIST, in memory.
type Dataset struct {
	// Split says which part of the dataset this is.
	Split Split
	// Images is a uint8 tensor of shape [N, 784], pixel values in [0, MaxPixel].
	Images *tensors.Tensor
	// Labels is an int32 tensor of shape [N, 1], values in [0, 9].
	Labels *tensors.Tensor
}

// Len returns the number of examples, N.
func (d *Dataset) Len() int { return d.Labels.Shape().Dimensions[0] }

// ErrNotInstalled is matched (with errors.Is) by the error [Load] and
// [LoadSplit] return when the directory or one of its files is missing.
var ErrNotInstalled = errors.New("Fashion-MNIST dataset not found")

// Option configures [Load] and [LoadSplit].
type Option func(*options)

type options struct {
	limit int
}

// Limit keeps only the first n examples of the training split, for quick
// runs and tests; n = 0 means no limit, and an n larger than the split keeps
// it whole. The test split is always loaded whole, so that evaluation
// numbers stay comparable between runs.
func Limit(n int) Option {
	return func(o *options) { o.limit = n }
}

// Load loads both splits from dir (use [DefaultDir] for the Debian
// package's copy). Each split's files are decoded concurrently.
func Load(dir string, opts ...Option) (train, test *Dataset, err error) {
	o, err := parseOptions(opts)
	if err != nil {
		return nil, nil, err
	}
	if err := checkDir(dir); err != nil {
		return nil, nil, err
	}
	var wg sync.WaitGroup
	var testErr error
	wg.Go(func() { test, testErr = loadSplit(dir, Test, o) })
	train, err = loadSplit(dir, Train, o)
	wg.Wait()
	if err != nil {
		return nil, nil, err
	}
	if testErr != nil {
		return nil, nil, testErr
	}
	return train, test, nil
}

// LoadSplit loads one split from dir (use [DefaultDir] for the Debian
// package's copy).
func LoadSplit(dir string, split Split, opts ...Option) (*Dataset, error) {
	if split != Train && split != Test {
		return nil, fmt.Errorf("fashionmnist: invalid split %v", split)
	}
	o, err := parseOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	return loadSplit(dir, split, o)
}

func parseOptions(opts []Option) (options, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.limit < 0 {
		return o, fmt.Errorf("fashionmnist: Limit(%d): the limit must be >= 0 (0 means no limit)", o.limit)
	}
	return o, nil
}

func installHint() string {
	return fmt.Sprintf("install it with `apt-get install %s` (it puts the files in %s), "+
		"or pass the directory that holds %s, %s, %s and %s",
		DebianPackage, DefaultDir, Train.ImagesFile(), Train.LabelsFile(), Test.ImagesFile(), Test.LabelsFile())
}

func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("fashionmnist: %w: directory %s does not exist (%w); %s", ErrNotInstalled, dir, fs.ErrNotExist, installHint())
	}
	if err != nil {
		return fmt.Errorf("fashionmnist: dataset directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("fashionmnist: %w: %s is not a directory; %s", ErrNotInstalled, dir, installHint())
	}
	return nil
}

// findFile returns the path of name (which ends in ".gz") in dir, or of
// name without ".gz" if only that exists.
func findFile(dir, name string) (string, error) {
	gz := filepath.Join(dir, name)
	plain := gz[:len(gz)-len(".gz")]
	for _, p := range []string{gz, plain} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("fashionmnist: %w", err)
		}
	}
	return "", fmt.Errorf("fashionmnist: %w: %s not found (nor %s: %w); %s",
		ErrNotInstalled, gz, filepath.Base(plain), fs.ErrNotExist, installHint())
}

func loadSplit(dir string, split Split, o options) (*Dataset, error) {
	imagesPath, err := findFile(dir, split.ImagesFile())
	if err != nil {
		return nil, err
	}
	labelsPath, err := findFile(dir, split.LabelsFile())
	if err != nil {
		return nil, err
	}

	// Decompressing the images dominates; read the labels alongside.
	var images, labels *idx.Array
	var imagesErr, labelsErr error
	var wg sync.WaitGroup
	wg.Go(func() { labels, labelsErr = idx.ReadFile(labelsPath) })
	images, imagesErr = idx.ReadFile(imagesPath)
	wg.Wait()
	if imagesErr != nil {
		return nil, fmt.Errorf("fashionmnist: %s images: %w", split, imagesErr)
	}
	if labelsErr != nil {
		return nil, fmt.Errorf("fashionmnist: %s labels: %w", split, labelsErr)
	}

	if images.Type != idx.Uint8 || len(images.Dims) != 3 || images.Dims[1] != Height || images.Dims[2] != Width {
		return nil, fmt.Errorf("fashionmnist: %s: images must be ubyte [N %d %d], got %v", imagesPath, Height, Width, images)
	}
	if labels.Type != idx.Uint8 || len(labels.Dims) != 1 {
		return nil, fmt.Errorf("fashionmnist: %s: labels must be ubyte [N], got %v", labelsPath, labels)
	}
	n := images.Dims[0]
	if labels.Dims[0] != n {
		return nil, fmt.Errorf("fashionmnist: %s split: %s holds %d images but %s holds %d labels",
			split, imagesPath, n, labelsPath, labels.Dims[0])
	}
	if split == Train && o.limit > 0 && o.limit < n {
		n = o.limit
	}
	pixels := images.Data.([]uint8)[:n*ImageSize]
	classes := labels.Data.([]uint8)[:n]
	for i, c := range classes {
		if int(c) >= NumClasses {
			return nil, fmt.Errorf("fashionmnist: %s: label %d of example %d is outside [0, %d]", labelsPath, c, i, NumClasses-1)
		}
	}

	imagesT := tensors.FromShape(shapes.Make(dtypes.Uint8, n, ImageSize))
	tensors.MustMutableFlatData(imagesT, func(flat []uint8) { copy(flat, pixels) })
	labelsT := tensors.FromShape(shapes.Make(dtypes.Int32, n, 1))
	tensors.MustMutableFlatData(labelsT, func(flat []int32) {
		for i, c := range classes {
			flat[i] = int32(c)
		}
	})
	return &Dataset{Split: split, Images: imagesT, Labels: labelsT}, nil
}
