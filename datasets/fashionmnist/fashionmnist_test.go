package fashionmnist_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/datasets/fashionmnist"
	"github.com/goaccel/goaccel/datasets/idx"
	"github.com/goaccel/goaccel/internal/testing/idxtest"
)

// fakeSplit is a tiny synthetic split: image i has every pixel equal to
// pixel(i, j) and label labels[i].
type fakeSplit struct {
	labels []uint8
}

func pixel(i, j int) uint8 { return uint8((i*37 + j) % 256) }

func (s fakeSplit) images() []uint8 {
	b := make([]uint8, len(s.labels)*fashionmnist.ImageSize)
	for i := range s.labels {
		for j := 0; j < fashionmnist.ImageSize; j++ {
			b[i*fashionmnist.ImageSize+j] = pixel(i, j)
		}
	}
	return b
}

var (
	fakeTrain = fakeSplit{labels: []uint8{9, 0, 0, 3, 2}}
	fakeTest  = fakeSplit{labels: []uint8{1, 7, 5}}
)

// writeFake writes the four files of a synthetic dataset into a new
// directory, compressed or not, and returns the directory.
func writeFake(t *testing.T, compress bool) string {
	t.Helper()
	dir := t.TempDir()
	suffix := ""
	if compress {
		suffix = ".gz"
	}
	for _, s := range []struct {
		prefix string
		split  fakeSplit
	}{{"train", fakeTrain}, {"t10k", fakeTest}} {
		n := len(s.split.labels)
		idxtest.WriteArray(t, dir, s.prefix+"-images-idx3-ubyte"+suffix, []int{n, 28, 28}, s.split.images(), compress)
		idxtest.WriteArray(t, dir, s.prefix+"-labels-idx1-ubyte"+suffix, []int{n}, s.split.labels, compress)
	}
	return dir
}

func checkSplit(t *testing.T, d *fashionmnist.Dataset, split fashionmnist.Split, want fakeSplit, n int) {
	t.Helper()
	require.NotNil(t, d)
	assert.Equal(t, split, d.Split)
	assert.Equal(t, n, d.Len())

	assert.Equal(t, dtypes.Uint8, d.Images.DType())
	assert.Equal(t, []int{n, 784}, d.Images.Shape().Dimensions)
	assert.Equal(t, dtypes.Int32, d.Labels.DType())
	assert.Equal(t, []int{n, 1}, d.Labels.Shape().Dimensions)

	pixels := tensors.MustCopyFlatData[uint8](d.Images)
	for i := 0; i < n; i++ {
		for j := 0; j < fashionmnist.ImageSize; j++ {
			require.Equal(t, pixel(i, j), pixels[i*fashionmnist.ImageSize+j], "image %d pixel %d", i, j)
		}
	}
	labels := tensors.MustCopyFlatData[int32](d.Labels)
	wantLabels := make([]int32, n)
	for i := range wantLabels {
		wantLabels[i] = int32(want.labels[i])
	}
	assert.Equal(t, wantLabels, labels)
}

func TestLoadSynthetic(t *testing.T) {
	tests := []struct {
		name      string
		compress  bool
		opts      []fashionmnist.Option
		wantTrain int
	}{
		{"gzip", true, nil, 5},
		{"plain files", false, nil, 5},
		{"limit", true, []fashionmnist.Option{fashionmnist.Limit(2)}, 2},
		{"limit 0 is no limit", true, []fashionmnist.Option{fashionmnist.Limit(0)}, 5},
		{"limit above size", true, []fashionmnist.Option{fashionmnist.Limit(1000)}, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeFake(t, tc.compress)
			train, test, err := fashionmnist.Load(dir, tc.opts...)
			require.NoError(t, err)
			checkSplit(t, train, fashionmnist.Train, fakeTrain, tc.wantTrain)
			// The test split is never limited.
			checkSplit(t, test, fashionmnist.Test, fakeTest, 3)

			for _, split := range []fashionmnist.Split{fashionmnist.Train, fashionmnist.Test} {
				d, err := fashionmnist.LoadSplit(dir, split, tc.opts...)
				require.NoError(t, err)
				n, want := tc.wantTrain, fakeTrain
				if split == fashionmnist.Test {
					n, want = 3, fakeTest
				}
				checkSplit(t, d, split, want, n)
			}
		})
	}
}

func TestScaling(t *testing.T) {
	dir := t.TempDir()
	img := make([]uint8, 784)
	img[0], img[1], img[2], img[783] = 0, 51, 255, 128
	for _, p := range []string{"train", "t10k"} {
		idxtest.WriteArray(t, dir, p+"-images-idx3-ubyte.gz", []int{1, 28, 28}, img, true)
		idxtest.WriteArray(t, dir, p+"-labels-idx1-ubyte.gz", []int{1}, []uint8{4}, true)
	}
	d, err := fashionmnist.LoadSplit(dir, fashionmnist.Train)
	require.NoError(t, err)
	assert.Equal(t, img, tensors.MustCopyFlatData[uint8](d.Images), "the files' pixel values, unchanged")
	scaled := graph.MustExecOnce(simplego.GetBackend(), fashionmnist.Scale, d.Images)
	require.Equal(t, dtypes.Float32, scaled.DType())
	px := tensors.MustCopyFlatData[float32](scaled)
	assert.Equal(t, float32(0), px[0])
	assert.InDelta(t, 0.2, px[1], 1e-7)
	assert.Equal(t, float32(1), px[2])
	assert.InDelta(t, 128.0/255, px[783], 1e-7)
	assert.Equal(t, "Coat", fashionmnist.ClassNames[tensors.MustCopyFlatData[int32](d.Labels)[0]])
}

func TestLoadErrors(t *testing.T) {
	const hint = "apt-get install dataset-fashion-mnist"
	tests := []struct {
		name string
		// setup returns the directory to load, after breaking it.
		setup        func(t *testing.T) string
		opts         []fashionmnist.Option
		contains     func(dir string) []string
		notInstalled bool // errors.Is(err, ErrNotInstalled)
		notExist     bool // errors.Is(err, fs.ErrNotExist)
		idxKind      error
	}{
		{
			name:  "missing directory",
			setup: func(t *testing.T) string { return filepath.Join(t.TempDir(), "no-such-dir") },
			contains: func(dir string) []string {
				return []string{"directory " + dir + " does not exist", hint, fashionmnist.DefaultDir}
			},
			notInstalled: true,
			notExist:     true,
		},
		{
			name: "directory is a file",
			setup: func(t *testing.T) string {
				return idxtest.WriteFile(t, t.TempDir(), "fashion-mnist", []byte("x"))
			},
			contains:     func(dir string) []string { return []string{dir + " is not a directory", hint} },
			notInstalled: true,
		},
		{
			name: "missing test labels",
			setup: func(t *testing.T) string {
				dir := writeFake(t, true)
				require.NoError(t, os.Remove(filepath.Join(dir, "t10k-labels-idx1-ubyte.gz")))
				return dir
			},
			contains: func(dir string) []string {
				return []string{filepath.Join(dir, "t10k-labels-idx1-ubyte.gz") + " not found", "nor t10k-labels-idx1-ubyte", hint}
			},
			notInstalled: true,
			notExist:     true,
		},
		{
			name: "empty directory",
			setup: func(t *testing.T) string {
				return t.TempDir()
			},
			contains: func(dir string) []string {
				return []string{filepath.Join(dir, "train-images-idx3-ubyte.gz") + " not found", hint}
			},
			notInstalled: true,
			notExist:     true,
		},
		{
			name: "images and labels count mismatch",
			setup: func(t *testing.T) string {
				dir := writeFake(t, true)
				idxtest.WriteArray(t, dir, "train-labels-idx1-ubyte.gz", []int{4}, []uint8{1, 2, 3, 4}, true)
				return dir
			},
			contains: func(dir string) []string {
				return []string{"train split", "train-images-idx3-ubyte.gz holds 5 images", "train-labels-idx1-ubyte.gz holds 4 labels"}
			},
		},
		{
			name: "images not 28x28",
			setup: func(t *testing.T) string {
				dir := writeFake(t, true)
				idxtest.WriteArray(t, dir, "t10k-images-idx3-ubyte.gz", []int{3, 32, 32}, make([]uint8, 3*32*32), true)
				return dir
			},
			contains: func(dir string) []string {
				return []string{"t10k-images-idx3-ubyte.gz: images must be ubyte [N 28 28], got ubyte[3 32 32]"}
			},
		},
		{
			name: "images flat",
			setup: func(t *testing.T) string {
				dir := writeFake(t, true)
				idxtest.WriteArray(t, dir, "train-images-idx3-ubyte.gz", []int{5, 784}, make([]uint8, 5*784), true)
				return dir
			},
			contains: func(dir string) []string { return []string{"images must be ubyte [N 28 28], got ubyte[5 784]"} },
		},
		{
			name: "images as float32",
			setup: func(t *testing.T) string {
				dir := writeFake(t, false)
				idxtest.WriteArray(t, dir, "train-images-idx3-ubyte", []int{5, 28, 28}, make([]float32, 5*784), false)
				return dir
			},
			contains: func(dir string) []string { return []string{"got float32[5 28 28]"} },
		},
		{
			name: "labels 2-D",
			setup: func(t *testing.T) string {
				dir := writeFake(t, true)
				idxtest.WriteArray(t, dir, "train-labels-idx1-ubyte.gz", []int{5, 1}, []uint8{1, 2, 3, 4, 5}, true)
				return dir
			},
			contains: func(dir string) []string { return []string{"labels must be ubyte [N], got ubyte[5 1]"} },
		},
		{
			name: "label out of range",
			setup: func(t *testing.T) string {
				dir := writeFake(t, true)
				idxtest.WriteArray(t, dir, "train-labels-idx1-ubyte.gz", []int{5}, []uint8{1, 2, 10, 4, 5}, true)
				return dir
			},
			contains: func(dir string) []string {
				return []string{"train-labels-idx1-ubyte.gz: label 10 of example 2 is outside [0, 9]"}
			},
		},
		{
			name: "truncated images file",
			setup: func(t *testing.T) string {
				dir := writeFake(t, false)
				path := filepath.Join(dir, "t10k-images-idx3-ubyte")
				require.NoError(t, os.Truncate(path, 16+100))
				return dir
			},
			contains: func(dir string) []string {
				return []string{"test images", filepath.Join(dir, "t10k-images-idx3-ubyte"),
					"expected 2352 bytes of data for dims [3 28 28] (ubyte), got 100"}
			},
			idxKind: idx.ErrTruncated,
		},
		{
			name:     "negative limit",
			setup:    func(t *testing.T) string { return writeFake(t, true) },
			opts:     []fashionmnist.Option{fashionmnist.Limit(-1)},
			contains: func(string) []string { return []string{"Limit(-1)", "must be >= 0"} },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.setup(t)
			train, test, err := fashionmnist.Load(dir, tc.opts...)
			require.Error(t, err)
			assert.Nil(t, train)
			assert.Nil(t, test)
			t.Log(err)
			for _, s := range tc.contains(dir) {
				assert.Contains(t, err.Error(), s)
			}
			assert.Equal(t, tc.notInstalled, errors.Is(err, fashionmnist.ErrNotInstalled), "errors.Is(err, ErrNotInstalled)")
			assert.Equal(t, tc.notExist, errors.Is(err, fs.ErrNotExist), "errors.Is(err, fs.ErrNotExist)")
			if tc.idxKind != nil {
				assert.ErrorIs(t, err, tc.idxKind)
			}
		})
	}
}

func TestLoadSplitInvalid(t *testing.T) {
	_, err := fashionmnist.LoadSplit(writeFake(t, true), fashionmnist.Split(7))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "invalid split Split(7)")
}

func TestSplitNames(t *testing.T) {
	tests := []struct {
		split          fashionmnist.Split
		name           string
		images, labels string
	}{
		{fashionmnist.Train, "train", "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"},
		{fashionmnist.Test, "test", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.name, tc.split.String())
			assert.Equal(t, tc.images, tc.split.ImagesFile())
			assert.Equal(t, tc.labels, tc.split.LabelsFile())
		})
	}
}

// TestRealDataset loads the copy installed by the Debian package. It is
// skipped where the package is missing, except in CI, which must have it.
func TestRealDataset(t *testing.T) {
	if _, err := os.Stat(fashionmnist.DefaultDir); err != nil {
		msg := "Fashion-MNIST not installed at " + fashionmnist.DefaultDir +
			": install it with `apt-get install " + fashionmnist.DebianPackage + "`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	start := time.Now()
	train, test, err := fashionmnist.Load(fashionmnist.DefaultDir)
	require.NoError(t, err)
	t.Logf("loaded %d train and %d test examples in %v", train.Len(), test.Len(), time.Since(start))

	tests := []struct {
		d        *fashionmnist.Dataset
		n        int
		perClass int
	}{
		{train, fashionmnist.TrainSize, 6000},
		{test, fashionmnist.TestSize, 1000},
	}
	for _, tc := range tests {
		t.Run(tc.d.Split.String(), func(t *testing.T) {
			assert.Equal(t, tc.n, tc.d.Len())
			assert.Equal(t, []int{tc.n, 784}, tc.d.Images.Shape().Dimensions)
			assert.Equal(t, []int{tc.n, 1}, tc.d.Labels.Shape().Dimensions)

			counts := make([]int, fashionmnist.NumClasses)
			for i, l := range tensors.MustCopyFlatData[int32](tc.d.Labels) {
				require.True(t, l >= 0 && l <= 9, "label %d of example %d", l, i)
				counts[l]++
			}
			for c, n := range counts {
				assert.Equal(t, tc.perClass, n, "examples of class %d (%s)", c, fashionmnist.ClassNames[c])
			}

			lo, hi := uint8(fashionmnist.MaxPixel), uint8(0)
			for _, v := range tensors.MustCopyFlatData[uint8](tc.d.Images) {
				lo, hi = min(lo, v), max(hi, v)
			}
			assert.Equal(t, uint8(0), lo)
			assert.Equal(t, uint8(fashionmnist.MaxPixel), hi)
		})
	}

	limited, err := fashionmnist.LoadSplit(fashionmnist.DefaultDir, fashionmnist.Train, fashionmnist.Limit(100))
	require.NoError(t, err)
	assert.Equal(t, 100, limited.Len())
	assert.Equal(t, tensors.MustCopyFlatData[int32](train.Labels)[:100], tensors.MustCopyFlatData[int32](limited.Labels))
}
