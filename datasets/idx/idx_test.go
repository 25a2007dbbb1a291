package idx_test

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/datasets/idx"
	"github.com/goaccel/goaccel/internal/testing/idxtest"
)

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		typ  idx.DataType
		dims []int
		data any
	}{
		{"ubyte images", idx.Uint8, []int{3, 2, 2}, []uint8{0, 1, 2, 3, 4, 5, 6, 7, 128, 200, 254, 255}},
		{"ubyte labels", idx.Uint8, []int{5}, []uint8{9, 0, 3, 7, 1}},
		{"sbyte", idx.Int8, []int{2, 3}, []int8{-128, -1, 0, 1, 64, 127}},
		{"int16", idx.Int16, []int{4}, []int16{math.MinInt16, -2, 300, math.MaxInt16}},
		{"int32", idx.Int32, []int{2, 2}, []int32{math.MinInt32, -70000, 70000, math.MaxInt32}},
		{"float32", idx.Float32, []int{3}, []float32{-1.5, 0, float32(math.Pi)}},
		{"float64", idx.Float64, []int{1, 1, 3}, []float64{math.Inf(-1), 1e-300, math.E}},
		{"empty outer dim", idx.Uint8, []int{0, 28, 28}, []uint8{}},
	}
	for _, tc := range tests {
		for _, compress := range []bool{false, true} {
			name := tc.name + "/plain"
			if compress {
				name = tc.name + "/gzip"
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				path := idxtest.WriteArray(t, dir, "array.idx", tc.dims, tc.data, compress)

				a, err := idx.ReadFile(path)
				require.NoError(t, err)
				assert.Equal(t, tc.typ, a.Type)
				assert.Equal(t, tc.dims, a.Dims)
				assert.Equal(t, tc.data, a.Data)
				assert.Equal(t, reflectLen(tc.data), a.Len())

				// The same bytes through Read, from a reader whose size is
				// unknown and that returns one byte at a time.
				raw, err := os.ReadFile(path)
				require.NoError(t, err)
				b, err := idx.Read(iotest.OneByteReader(bytes.NewReader(raw)))
				require.NoError(t, err)
				assert.Equal(t, a, b)
			})
		}
	}
}

func reflectLen(data any) int {
	switch v := data.(type) {
	case []uint8:
		return len(v)
	case []int8:
		return len(v)
	case []int16:
		return len(v)
	case []int32:
		return len(v)
	case []float32:
		return len(v)
	case []float64:
		return len(v)
	}
	panic("unexpected type")
}

// Gzip is detected by its magic bytes, not by the file name.
func TestGzipDetectedByContent(t *testing.T) {
	dir := t.TempDir()
	data := []uint8{1, 2, 3, 4}
	tests := []struct {
		name     string
		compress bool
	}{
		{"plain.gz", false},
		{"compressed-without-suffix", true},
		{"compressed.gz", true},
		{"plain", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := idxtest.WriteArray(t, dir, tc.name, []int{4}, data, tc.compress)
			a, err := idx.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, data, a.Data)
		})
	}
}

// A file of several concatenated gzip members (as `cat a.gz b.gz` makes) is
// one stream, like gunzip reads it.
func TestGzipMultiMember(t *testing.T) {
	file := idxtest.Encode([]int{2, 3}, []uint8{1, 2, 3, 4, 5, 6})
	content := append(idxtest.Gzip(file[:7]), idxtest.Gzip(file[7:])...)
	a, err := idx.Read(bytes.NewReader(content))
	require.NoError(t, err)
	assert.Equal(t, []uint8{1, 2, 3, 4, 5, 6}, a.Data)
}

func TestErrors(t *testing.T) {
	valid := idxtest.Encode([]int{10}, []uint8{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	// Incompressible data, so that cutting the gzip stream in its middle
	// cuts the array's data.
	noise := make([]uint8, 4096)
	for i := range noise {
		noise[i] = uint8((i*7919 + i*i*31) >> 3)
	}
	big := idxtest.Gzip(idxtest.Encode([]int{4096}, noise))
	badCRC := bytes.Clone(idxtest.Gzip(valid))
	badCRC[len(badCRC)-8] ^= 0xFF // the CRC-32 is the trailer's first 4 bytes
	badDeflate := bytes.Clone(idxtest.Gzip(valid))
	for i := 10; i < len(badDeflate)-8; i++ { // garbage instead of the deflate data
		badDeflate[i] = 0xFF
	}

	tests := []struct {
		name    string
		content []byte
		kind    error
		reasons []string
	}{
		{
			name: "empty file", content: nil, kind: idx.ErrTruncated,
			reasons: []string{"truncated header", "expected 4 bytes", "got 0"},
		},
		{
			name: "header truncated in magic", content: []byte{0, 0}, kind: idx.ErrTruncated,
			reasons: []string{"truncated header", "expected 4 bytes (magic, type, number of dimensions), got 2"},
		},
		{
			name: "header truncated in dims", content: idxtest.Header(idxtest.Uint8, 3, 4)[:6], kind: idx.ErrTruncated,
			reasons: []string{"truncated header", "expected 8 bytes for the sizes of 2 dimensions, got 2"},
		},
		{
			name: "header truncated in dims, gzip", content: idxtest.Gzip(idxtest.Header(idxtest.Uint8, 3, 4)[:6]),
			kind:    idx.ErrTruncated,
			reasons: []string{"truncated header", "expected 8 bytes for the sizes of 2 dimensions, got 2"},
		},
		{
			name: "data truncated", content: valid[:len(valid)-4], kind: idx.ErrTruncated,
			reasons: []string{"truncated data", "expected 10 bytes of data for dims [10] (ubyte), got 6"},
		},
		{
			name: "data truncated, gzip", content: idxtest.Gzip(valid[:len(valid)-4]), kind: idx.ErrTruncated,
			reasons: []string{"truncated data", "expected 10 bytes of data for dims [10] (ubyte), got 6"},
		},
		{
			name: "data truncated, int32 dims", content: idxtest.Encode([]int{2, 3}, []int32{1, 2, 3, 4, 5, 6})[:20],
			kind:    idx.ErrTruncated,
			reasons: []string{"truncated data", "expected 24 bytes of data for dims [2 3] (int32), got 8"},
		},
		{
			name: "gzip stream truncated in the data", content: big[:len(big)/2], kind: idx.ErrTruncated,
			reasons: []string{"truncated gzip stream", "in the data", "expected 4096 bytes of data for dims [4096] (ubyte), got"},
		},
		{
			name: "gzip stream truncated in the trailer", content: big[:len(big)-3], kind: idx.ErrTruncated,
			reasons: []string{"truncated gzip stream", "after the data, in the gzip trailer", "all 4096 bytes of data were read"},
		},
		{
			name: "gzip stream truncated in the gzip header", content: big[:5], kind: idx.ErrTruncated,
			reasons: []string{"truncated gzip stream", "inside the gzip header"},
		},
		{
			name: "gzip checksum mismatch", content: badCRC, kind: idx.ErrCorrupt,
			reasons: []string{"corrupt gzip stream", "checksum mismatch"},
		},
		{
			name: "gzip deflate data damaged", content: badDeflate, kind: idx.ErrCorrupt,
			reasons: []string{"corrupt gzip stream"},
		},
		{
			name: "wrong magic", content: append([]byte{0x01, 0x02, 0x08, 0x01}, valid[4:]...), kind: idx.ErrBadMagic,
			reasons: []string{"bad magic number 0x01020801", "not an IDX file"},
		},
		{
			name: "text file", content: []byte("hello, world\n"), kind: idx.ErrBadMagic,
			reasons: []string{"bad magic number 0x68656C6C"},
		},
		{
			name: "wrong magic, gzip", content: idxtest.Gzip([]byte("PK\x03\x04zip")), kind: idx.ErrBadMagic,
			reasons: []string{"bad magic number 0x504B0304"},
		},
		{
			name: "unsupported type", content: append(idxtest.Header(0x0A, 2), 1, 2), kind: idx.ErrUnsupportedType,
			reasons: []string{"unsupported data type 0x0A", "0x08 ubyte"},
		},
		{
			name: "zero dimensions", content: idxtest.Header(idxtest.Uint8), kind: idx.ErrBadHeader,
			reasons: []string{"declares 0 dimensions"},
		},
		{
			name: "trailing garbage", content: append(bytes.Clone(valid), 'x', 'y', 'z'), kind: idx.ErrTrailingData,
			reasons: []string{"trailing garbage: 3 bytes after the 10 bytes of data"},
		},
		{
			name: "trailing garbage, gzip", content: idxtest.Gzip(append(bytes.Clone(valid), 0)), kind: idx.ErrTrailingData,
			reasons: []string{"trailing garbage: 1 byte after the 10 bytes of data", "decompressed stream"},
		},
		{
			name: "non-gzip bytes after the gzip stream", content: append(idxtest.Gzip(valid), "junk"...),
			kind:    idx.ErrTrailingData,
			reasons: []string{"trailing garbage: 4 bytes after the end of the gzip stream", "not another gzip member"},
		},
		{
			name: "damaged second gzip member", content: append(idxtest.Gzip(valid[:9]), append([]byte{0x1f, 0x8b, 0xFF}, idxtest.Gzip(valid[9:])[3:]...)...),
			kind:    idx.ErrCorrupt,
			reasons: []string{"corrupt gzip stream: invalid header of a following gzip member, in the data"},
		},
		{
			name: "dims overflow", content: idxtest.Header(idxtest.Float64, math.MaxUint32, math.MaxUint32, math.MaxUint32),
			kind:    idx.ErrTooLarge,
			reasons: []string{"dims [4294967295 4294967295 4294967295] (float64) overflow"},
		},
		{
			name: "dims beyond the limit", content: idxtest.Header(idxtest.Uint8, 60000, 60000, 2), kind: idx.ErrTooLarge,
			reasons: []string{"dims [60000 60000 2] (ubyte) need 7200000000 bytes of data", "limit of 4294967296 bytes"},
		},
		{
			name: "absurd size on a small plain file", content: idxtest.Header(idxtest.Float32, 1<<28), kind: idx.ErrTruncated,
			reasons: []string{"truncated data", "expected 1073741824 bytes of data for dims [268435456] (float32), got 0"},
		},
		{
			name: "absurd size on a small gzip file", content: idxtest.Gzip(append(idxtest.Header(idxtest.Float32, 1<<28), 1, 2, 3)),
			kind:    idx.ErrTruncated,
			reasons: []string{"truncated data", "expected 1073741824 bytes of data for dims [268435456] (float32), got 3"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := idxtest.WriteFile(t, t.TempDir(), "bad-idx3-ubyte", tc.content)
			a, err := idx.ReadFile(path)
			require.Error(t, err)
			assert.Nil(t, a)
			checkError(t, err, path, tc.kind, tc.reasons...)

			// Read on a reader whose size is unknown reports the same
			// problem, named with WithName.
			_, err = idx.Read(io.MultiReader(bytes.NewReader(tc.content)), idx.WithName("stream.idx"))
			require.Error(t, err)
			checkError(t, err, "stream.idx", tc.kind, tc.reasons[0])
		})
	}
}

func checkError(t *testing.T, err error, file string, kind error, reasons ...string) {
	t.Helper()
	msg := err.Error()
	t.Log(msg)
	assert.Contains(t, msg, "idx: "+file+": ", "the error names the file")
	for _, r := range reasons {
		assert.Contains(t, msg, r)
	}
	assert.ErrorIs(t, err, kind)
	var e *idx.Error
	if assert.ErrorAs(t, err, &e) {
		assert.Equal(t, file, e.File)
		assert.NotEmpty(t, e.Reason)
	}
}

// A header announcing 1 GiB on a small stream of unknown size must not make
// the reader allocate that gigabyte.
func TestNoHugeAllocationOnCorruptHeader(t *testing.T) {
	content := idxtest.Gzip(append(idxtest.Header(idxtest.Uint8, 1<<30), 1, 2, 3))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := idx.Read(io.MultiReader(bytes.NewReader(content)))
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, idx.ErrTruncated)
	allocated := after.TotalAlloc - before.TotalAlloc
	assert.Less(t, allocated, uint64(64<<20), "allocated %d bytes for a %d-byte file", allocated, len(content))
}

func TestReadFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no-such-file.gz")
	_, err := idx.ReadFile(path)
	require.Error(t, err)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), "cannot open")
}

func TestReadNames(t *testing.T) {
	bad := []byte("not idx")
	tests := []struct {
		name   string
		reader func(t *testing.T) io.Reader
		opts   []idx.Option
		want   string
	}{
		{"default", func(*testing.T) io.Reader { return bytes.NewReader(bad) }, nil, "<input>"},
		{"WithName", func(*testing.T) io.Reader { return bytes.NewReader(bad) }, []idx.Option{idx.WithName("x.idx")}, "x.idx"},
		{"os.File", func(t *testing.T) io.Reader {
			path := idxtest.WriteFile(t, t.TempDir(), "f.idx", bad)
			f, err := os.Open(path)
			require.NoError(t, err)
			t.Cleanup(func() { f.Close() })
			return f
		}, nil, "f.idx"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := idx.Read(tc.reader(t), tc.opts...)
			var e *idx.Error
			require.ErrorAs(t, err, &e)
			assert.Contains(t, e.File, tc.want)
		})
	}
}

func TestWithMaxBytes(t *testing.T) {
	content := idxtest.Encode([]int{4, 4}, make([]float32, 16)) // 64 bytes of data
	tests := []struct {
		name    string
		max     int64
		wantErr bool
	}{
		{"below", 63, true},
		{"exact", 64, false},
		{"zero means default", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := idx.Read(bytes.NewReader(content), idx.WithMaxBytes(tc.max))
			if !tc.wantErr {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, idx.ErrTooLarge)
			assert.Contains(t, err.Error(), "need 64 bytes of data, more than the limit of 63 bytes")
		})
	}
}

func TestValues(t *testing.T) {
	a, err := idx.Read(bytes.NewReader(idxtest.Encode([]int{2}, []int16{-1, 7})))
	require.NoError(t, err)

	v, err := idx.Values[int16](a)
	require.NoError(t, err)
	assert.Equal(t, []int16{-1, 7}, v)

	_, err = idx.Values[float32](a)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "int16")
	assert.Equal(t, "int16[2]", a.String())
}

func TestDataType(t *testing.T) {
	tests := []struct {
		typ   idx.DataType
		size  int
		name  string
		valid bool
	}{
		{idx.Uint8, 1, "ubyte", true},
		{idx.Int8, 1, "sbyte", true},
		{idx.Int16, 2, "int16", true},
		{idx.Int32, 4, "int32", true},
		{idx.Float32, 4, "float32", true},
		{idx.Float64, 8, "float64", true},
		{0x0A, 0, "0x0A", false},
		{0x00, 0, "0x00", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.size, tc.typ.Size())
			assert.Equal(t, tc.name, tc.typ.String())
			assert.Equal(t, tc.valid, tc.typ.Valid())
		})
	}
}

func TestErrorUnwrap(t *testing.T) {
	e := &idx.Error{File: "f", Kind: idx.ErrTruncated, Reason: "r", Err: io.ErrUnexpectedEOF}
	assert.True(t, errors.Is(e, idx.ErrTruncated))
	assert.True(t, errors.Is(e, io.ErrUnexpectedEOF))
	assert.False(t, errors.Is(e, idx.ErrBadMagic))
	assert.Equal(t, "idx: f: r", e.Error())
}
