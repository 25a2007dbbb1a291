package idx_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/goaccel/goaccel/datasets/idx"
	"github.com/goaccel/goaccel/internal/testing/idxtest"
)

// Decoding an IDX array from memory: two 2×3 ubyte "images".
func ExampleRead() {
	file := []byte{
		0x00, 0x00, // magic
		0x08,       // type: ubyte
		0x03,       // 3 dimensions
		0, 0, 0, 2, // 2 images
		0, 0, 0, 2, // of 2 rows
		0, 0, 0, 3, // of 3 columns
		1, 2, 3, 4, 5, 6, // image 0
		7, 8, 9, 10, 11, 12, // image 1
	}
	a, err := idx.Read(bytes.NewReader(file))
	if err != nil {
		fmt.Println(err)
		return
	}
	pixels, _ := idx.Values[uint8](a)
	fmt.Println(a, pixels[6:])
	// Output: ubyte[2 2 3] [7 8 9 10 11 12]
}

// ReadFile reads gzip-compressed files (detected by content) as well as
// plain ones, and its errors name the file and the problem.
func ExampleReadFile() {
	dir, _ := os.MkdirTemp("", "idx-example")
	defer os.RemoveAll(dir)

	good := filepath.Join(dir, "labels-idx1-ubyte.gz")
	_ = os.WriteFile(good, idxtest.Gzip(idxtest.Encode([]int{4}, []uint8{9, 0, 0, 3})), 0o644)
	labels, err := idx.ReadFile(good)
	fmt.Println(labels.Data, err)

	// The same file with its last label cut off.
	cut := filepath.Join(dir, "cut-idx1-ubyte")
	_ = os.WriteFile(cut, idxtest.Encode([]int{4}, []uint8{9, 0, 0, 3})[:11], 0o644)
	_, err = idx.ReadFile(cut)
	fmt.Println(errors.Is(err, idx.ErrTruncated))
	var e *idx.Error
	if errors.As(err, &e) {
		fmt.Println(filepath.Base(e.File)+":", e.Reason)
	}
	// Output:
	// [9 0 0 3] <nil>
	// true
	// cut-idx1-ubyte: truncated data: expected 4 bytes of data for dims [4] (ubyte), got 3
}
