// Package idxtest writes IDX files for tests: well-formed ones, to check
// readers of IDX-based datasets on small synthetic data, and deliberately
// malformed ones (wrong magic, short data, cut gzip streams) through the
// lower-level [Header] and [Gzip] helpers.
//
// The encoder is written independently of package idx's decoder (it uses
// encoding/binary), so round-trip tests check one against the other.
package idxtest

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Type codes of the IDX format, repeated here so that malformed files can
// use any byte value.
const (
	Uint8   byte = 0x08
	Int8    byte = 0x09
	Int16   byte = 0x0B
	Int32   byte = 0x0C
	Float32 byte = 0x0D
	Float64 byte = 0x0E
)

// Header returns an IDX header: two zero bytes, the type code, the number of
// dimensions and each dimension as a big-endian uint32.
func Header(typ byte, dims ...uint32) []byte {
	b := []byte{0, 0, typ, byte(len(dims))}
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, d)
	}
	return b
}

// Encode returns a complete IDX file (header and big-endian data) for data,
// which must be a []uint8, []int8, []int16, []int32, []float32 or []float64
// whose length is the product of dims. It panics otherwise: a broken test
// fixture is a bug in the test.
func Encode(dims []int, data any) []byte {
	var typ byte
	n := 0
	switch v := data.(type) {
	case []uint8:
		typ, n = Uint8, len(v)
	case []int8:
		typ, n = Int8, len(v)
	case []int16:
		typ, n = Int16, len(v)
	case []int32:
		typ, n = Int32, len(v)
	case []float32:
		typ, n = Float32, len(v)
	case []float64:
		typ, n = Float64, len(v)
	default:
		panic(fmt.Sprintf("idxtest.Encode: unsupported data type %T", data))
	}
	want := 1
	udims := make([]uint32, len(dims))
	for i, d := range dims {
		want *= d
		udims[i] = uint32(d)
	}
	if n != want {
		panic(fmt.Sprintf("idxtest.Encode: %d elements for dims %v, want %d", n, dims, want))
	}
	var buf bytes.Buffer
	buf.Write(Header(typ, udims...))
	if err := binary.Write(&buf, binary.BigEndian, data); err != nil {
		panic(fmt.Sprintf("idxtest.Encode: %v", err))
	}
	return buf.Bytes()
}

// Gzip returns b compressed with gzip.
func Gzip(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		panic(err)
	}
	if err := zw.Close(); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// WriteFile writes content to name inside dir (creating dir if needed) and
// returns the file's path. It fails the test on error.
func WriteFile(tb testing.TB, dir, name string, content []byte) string {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatalf("idxtest: %v", err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, content, 0o644); err != nil {
		tb.Fatalf("idxtest: %v", err)
	}
	return path
}

// WriteArray encodes data with dims (see [Encode]), gzip-compresses it if
// compress is true, writes it to name inside dir and returns the path.
func WriteArray(tb testing.TB, dir, name string, dims []int, data any, compress bool) string {
	tb.Helper()
	b := Encode(dims, data)
	if compress {
		b = Gzip(b)
	}
	return WriteFile(tb, dir, name, b)
}
