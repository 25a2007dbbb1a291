// Package idx reads IDX files, the simple binary array format in which the
// MNIST and Fashion-MNIST datasets are distributed.
//
// An IDX file is a header followed by the array data:
//
//	bytes 0-1   magic: always 0x00 0x00
//	byte  2     element type: 0x08 uint8, 0x09 int8, 0x0B int16,
//	            0x0C int32, 0x0D float32, 0x0E float64
//	byte  3     number of dimensions, n
//	n × 4 bytes size of each dimension, big-endian uint32
//	data        the elements in row-major (C) order, big-endian
//
// Files are often distributed gzip-compressed (train-images-idx3-ubyte.gz).
// [Read] and [ReadFile] detect gzip by its magic bytes (0x1f 0x8b), never by
// the file name, so a compressed file with a plain name and a plain file with
// a ".gz" name both work.
//
// The reader is defensive: every error is an [*Error] naming the file and
// saying exactly what is wrong, and a corrupted header cannot make it
// allocate more memory than the data actually present (plus a bounded read
// chunk) or more than the limit set with [WithMaxBytes].
package idx

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
)

// DataType is the element type code stored in byte 2 of an IDX header.
type DataType byte

// The element types defined by the IDX format.
const (
	Uint8   DataType = 0x08 // unsigned byte; Array.Data is []uint8
	Int8    DataType = 0x09 // signed byte; Array.Data is []int8
	Int16   DataType = 0x0B // big-endian int16; Array.Data is []int16
	Int32   DataType = 0x0C // big-endian int32; Array.Data is []int32
	Float32 DataType = 0x0D // big-endian IEEE 754 float32; Array.Data is []float32
	Float64 DataType = 0x0E // big-endian IEEE 754 float64; Array.Data is []float64
)

// Valid reports whether t is one of the type codes defined by the format.
func (t DataType) Valid() bool { return t.Size() > 0 }

// Size returns the size in bytes of one element of type t, or 0 if t is not
// a valid type code.
func (t DataType) Size() int {
	switch t {
	case Uint8, Int8:
		return 1
	case Int16:
		return 2
	case Int32, Float32:
		return 4
	case Float64:
		return 8
	}
	return 0
}

// String returns the type's name as used in the IDX documentation
// ("ubyte", "sbyte", "int16", "int32", "float32", "float64"), or its hex
// code for unknown types.
func (t DataType) String() string {
	switch t {
	case Uint8:
		return "ubyte"
	case Int8:
		return "sbyte"
	case Int16:
		return "int16"
	case Int32:
		return "int32"
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	}
	return fmt.Sprintf("0x%02X", byte(t))
}

// Element is the set of Go types an [Array] can hold, one per [DataType].
type Element interface {
	uint8 | int8 | int16 | int32 | float32 | float64
}

// Array is a decoded IDX file.
type Array struct {
	// Type is the element type from the header.
	Type DataType

	// Dims are the dimensions from the header, outermost first: for the MNIST
	// training images [60000 28 28].
	Dims []int

	// Data holds the elements in row-major order, converted to native byte
	// order, as a slice whose Go type matches Type: []uint8 for Uint8,
	// []int8 for Int8, []int16 for Int16, []int32 for Int32, []float32 for
	// Float32 and []float64 for Float64. Its length is the product of Dims.
	// Use [Values] for typed access.
	Data any
}

// Len returns the number of elements: the product of a.Dims.
func (a *Array) Len() int {
	n := 1
	for _, d := range a.Dims {
		n *= d
	}
	return n
}

// String returns a short description such as "ubyte[60000 28 28]".
func (a *Array) String() string {
	return fmt.Sprintf("%s%v", a.Type, a.Dims)
}

// Values returns a.Data as a []T. It fails if T does not match a.Type
// (for example asking for []float32 from a ubyte file).
func Values[T Element](a *Array) ([]T, error) {
	v, ok := a.Data.([]T)
	if !ok {
		var zero T
		return nil, fmt.Errorf("idx: array holds %s elements (%T), not %T", a.Type, a.Data, zero)
	}
	return v, nil
}

// Sentinel errors, matched with [errors.Is] against the errors returned by
// [Read] and [ReadFile].
var (
	// ErrBadMagic: the first two bytes are not zero, so this is not an IDX
	// file (nor a gzip-compressed one).
	ErrBadMagic = errors.New("bad magic number")
	// ErrUnsupportedType: the type byte is not one of the defined codes.
	ErrUnsupportedType = errors.New("unsupported data type")
	// ErrBadHeader: a header field is invalid (for example zero dimensions).
	ErrBadHeader = errors.New("invalid header")
	// ErrTruncated: the header or the data ends early.
	ErrTruncated = errors.New("truncated")
	// ErrTrailingData: there are bytes after the data the header announces.
	ErrTrailingData = errors.New("trailing data")
	// ErrTooLarge: the header announces more data than the limit (or more
	// than fits in memory addresses on this platform).
	ErrTooLarge = errors.New("data too large")
	// ErrCorrupt: the gzip stream is damaged (bad header, bad checksum,
	// invalid deflate data, a damaged following member). A gzip stream cut
	// short is ErrTruncated.
	ErrCorrupt = errors.New("corrupt gzip stream")
)

// Error is the type of every error returned by [Read] and [ReadFile].
type Error struct {
	// File is the file's path, the name given with [WithName], the Name() of
	// the reader, or "<input>".
	File string
	// Kind is one of the sentinel errors (ErrBadMagic, ErrTruncated, ...), or
	// nil for errors from the operating system (opening, reading).
	Kind error
	// Reason says what is wrong, in words, without the file name.
	Reason string
	// Err is the underlying error, if any (an *os.PathError, a gzip error).
	Err error
}

// Error returns "idx: FILE: REASON".
func (e *Error) Error() string {
	return "idx: " + e.File + ": " + e.Reason
}

// Unwrap returns Kind and Err, so that errors.Is works with both the
// package's sentinels and underlying errors such as fs.ErrNotExist.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// DefaultMaxBytes is the default limit on the size of the data section
// (after decompression): 4 GiB. Change it with [WithMaxBytes].
const DefaultMaxBytes int64 = 4 << 30

// readChunk is the most the reader allocates ahead of data it has actually
// received when the total size of the input is not known in advance.
const readChunk = 16 << 20

// Option configures [Read] and [ReadFile].
type Option func(*config)

type config struct {
	name     string
	maxBytes int64
}

// WithName sets the name used in error messages (by default the path given
// to ReadFile, or the reader's Name() method as on *os.File, or "<input>").
func WithName(name string) Option {
	return func(c *config) { c.name = name }
}

// WithMaxBytes sets the largest data section, in bytes after decompression,
// that the reader accepts; a header announcing more is rejected with
// [ErrTooLarge] before anything is allocated. n <= 0 restores
// [DefaultMaxBytes].
func WithMaxBytes(n int64) Option {
	return func(c *config) { c.maxBytes = n }
}

// ReadFile reads the IDX file at path, plain or gzip-compressed.
func ReadFile(path string, opts ...Option) (*Array, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &Error{File: path, Reason: "cannot open: " + causeOf(err), Err: err}
	}
	defer f.Close()
	return Read(f, append([]Option{WithName(path)}, opts...)...)
}

// Read reads one IDX array, plain or gzip-compressed, from r and checks that
// nothing follows it.
//
// When r's remaining size can be known (an *os.File on a regular file, or a
// reader with a Len() int method such as *bytes.Reader), a plain file whose
// header announces more data than the file holds is rejected before the data
// is allocated.
func Read(r io.Reader, opts ...Option) (*Array, error) {
	cfg := config{maxBytes: DefaultMaxBytes}
	if n, ok := r.(interface{ Name() string }); ok {
		cfg.name = n.Name()
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.name == "" {
		cfg.name = "<input>"
	}
	if cfg.maxBytes <= 0 {
		cfg.maxBytes = DefaultMaxBytes
	}
	d := &decoder{cfg: cfg, remaining: remainingSize(r)}
	return d.decode(r)
}

type decoder struct {
	cfg       config
	remaining int64 // bytes left in the raw (plain) input, or -1 if unknown
	gzipped   bool
	gz        *gzipStream // when gzipped
}

func (d *decoder) errorf(kind, cause error, format string, args ...any) *Error {
	return &Error{File: d.cfg.name, Kind: kind, Reason: fmt.Sprintf(format, args...), Err: cause}
}

func (d *decoder) decode(raw io.Reader) (*Array, error) {
	br := bufio.NewReaderSize(raw, 64<<10)
	r := io.Reader(br)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, d.gzipHeaderError(err)
		}
		defer zr.Close()
		zr.Multistream(false)
		d.gzipped = true
		d.remaining = -1
		d.gz = &gzipStream{br: br, zr: zr}
		r = d.gz
	}

	// Fixed 4-byte part of the header: magic (2 bytes), type, ndims.
	var head [4]byte
	if n, err := readFull(r, head[:]); err != nil {
		return nil, d.readFailure(err, "header",
			fmt.Sprintf("expected 4 bytes (magic, type, number of dimensions), got %d", n))
	}
	if head[0] != 0 || head[1] != 0 {
		return nil, d.errorf(ErrBadMagic, nil,
			"bad magic number 0x%02X%02X%02X%02X: an IDX file starts with two zero bytes (and a gzip-compressed one with 1F 8B); this is not an IDX file",
			head[0], head[1], head[2], head[3])
	}
	typ := DataType(head[2])
	if !typ.Valid() {
		return nil, d.errorf(ErrUnsupportedType, nil,
			"unsupported data type 0x%02X in header (supported: 0x08 ubyte, 0x09 sbyte, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64)",
			head[2])
	}
	ndims := int(head[3])
	if ndims == 0 {
		return nil, d.errorf(ErrBadHeader, nil, "invalid header: it declares 0 dimensions")
	}

	// Dimensions: ndims big-endian uint32.
	dimBytes := make([]byte, 4*ndims)
	if n, err := readFull(r, dimBytes); err != nil {
		return nil, d.readFailure(err, "header",
			fmt.Sprintf("expected %d bytes for the sizes of %s, got %d", len(dimBytes), plural(int64(ndims), "dimension"), n))
	}
	dims := make([]int, ndims)
	// Size in bytes of the data, with overflow checks: a uint32 dimension
	// times an element size of at most 8 always fits in a uint64, so only
	// the running product can overflow.
	size, overflow := uint64(typ.Size()), false
	for i := range dims {
		v := binary.BigEndian.Uint32(dimBytes[4*i:])
		dims[i] = int(v)
		hi, lo := bits.Mul64(size, uint64(v))
		if hi != 0 {
			overflow = true
		}
		size = lo
	}
	if d.remaining >= 0 {
		d.remaining -= int64(4 + 4*ndims)
	}
	if overflow || size > math.MaxInt64 || size > uint64(math.MaxInt) {
		return nil, d.errorf(ErrTooLarge, nil,
			"dims %v (%s) overflow: the data size in bytes does not fit in a %d-bit integer (corrupted header?)",
			dims, typ, bits.UintSize)
	}
	want := int64(size)
	if want > d.cfg.maxBytes {
		return nil, d.errorf(ErrTooLarge, nil,
			"dims %v (%s) need %d bytes of data, more than the limit of %d bytes (corrupted header? raise the limit with idx.WithMaxBytes)",
			dims, typ, want, d.cfg.maxBytes)
	}
	if d.remaining >= 0 && d.remaining < want {
		return nil, d.errorf(ErrTruncated, nil,
			"truncated data: expected %d bytes of data for dims %v (%s), got %d",
			want, dims, typ, d.remaining)
	}

	data, err := d.readData(r, want, dims, typ)
	if err != nil {
		return nil, err
	}
	if err := d.checkEnd(r, want); err != nil {
		return nil, err
	}
	return &Array{Type: typ, Dims: dims, Data: convert(typ, data)}, nil
}

// readFull is io.ReadFull without its conversion of io.EOF into
// io.ErrUnexpectedEOF: a plain io.EOF means the (decompressed) content ended
// cleanly, while io.ErrUnexpectedEOF from a gzip reader means the compressed
// stream itself was cut short.
func readFull(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			if n == len(buf) && err == io.EOF {
				return n, nil
			}
			return n, err
		}
	}
	return n, nil
}

// readData reads exactly want bytes. When the input size is known (and has
// been checked) it allocates them at once; otherwise it grows the buffer as
// data arrives, so a header announcing gigabytes on a small stream costs at
// most readChunk bytes before the truncation is detected.
func (d *decoder) readData(r io.Reader, want int64, dims []int, typ DataType) ([]byte, error) {
	capacity := want
	if d.remaining < 0 && capacity > readChunk {
		capacity = readChunk
	}
	buf := make([]byte, 0, int(capacity))
	for int64(len(buf)) < want {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), int(min(2*int64(cap(buf)), want)))
			copy(grown, buf)
			buf = grown
		}
		n, err := readFull(r, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil && int64(len(buf)) == want {
			// The data is complete but the stream failed right after it
			// (a gzip reader can return the last bytes and a cut trailer
			// in the same call).
			return nil, d.readFailure(err, "trailer", fmt.Sprintf("all %d bytes of data were read", want))
		}
		if err != nil {
			return nil, d.readFailure(err, "data",
				fmt.Sprintf("expected %d bytes of data for dims %v (%s), got %d", want, dims, typ, len(buf)))
		}
	}
	return buf, nil
}

// checkEnd makes sure the input ends right after the data. For gzip input
// this also reads the gzip trailer, which verifies the CRC-32 and length.
func (d *decoder) checkEnd(r io.Reader, dataLen int64) error {
	const maxCount = 1 << 20
	n, err := io.Copy(io.Discard, io.LimitReader(r, maxCount+1))
	if err != nil {
		return d.readFailure(err, "trailer", fmt.Sprintf("all %d bytes of data were read", dataLen))
	}
	if n == 0 && d.gz != nil && d.gz.garbage > 0 {
		count := plural(d.gz.garbage, "byte")
		if d.gz.garbage > maxCount {
			count = "more than " + plural(maxCount, "byte")
		}
		return d.errorf(ErrTrailingData, nil,
			"trailing garbage: %s after the end of the gzip stream (they are not another gzip member)", count)
	}
	if n == 0 {
		return nil
	}
	what := "file"
	if d.gzipped {
		what = "decompressed stream"
	}
	count := plural(n, "byte")
	if n > maxCount {
		count = "more than " + plural(maxCount, "byte")
	}
	return d.errorf(ErrTrailingData, nil,
		"trailing garbage: %s after the %d bytes of data the header announces (the %s is longer than its dims say)",
		count, dataLen, what)
}

// readFailure turns a failed read of part ("header", "data", or "trailer"
// for whatever follows the data) into an *Error; detail says what was
// expected and what was got.
func (d *decoder) readFailure(err error, part, detail string) *Error {
	where := "in the " + part
	if part == "trailer" {
		where = "after the data, in the gzip trailer"
	}
	switch {
	case err == io.EOF || (!d.gzipped && errors.Is(err, io.ErrUnexpectedEOF)):
		return d.errorf(ErrTruncated, err, "truncated %s: %s", part, detail)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return d.errorf(ErrTruncated, err,
			"truncated gzip stream: the compressed data ends early, %s: %s", where, detail)
	case errors.Is(err, gzip.ErrChecksum):
		return d.errorf(ErrCorrupt, err,
			"corrupt gzip stream: checksum mismatch %s (%s): the file is damaged", where, detail)
	case errors.Is(err, gzip.ErrHeader):
		return d.errorf(ErrCorrupt, err,
			"corrupt gzip stream: invalid header of a following gzip member, %s (%s)", where, detail)
	case isFlateError(err):
		return d.errorf(ErrCorrupt, err, "corrupt gzip stream: %v, %s (%s)", err, where, detail)
	}
	return d.errorf(nil, err, "read error %s: %v (%s)", where, err, detail)
}

func (d *decoder) gzipHeaderError(err error) *Error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return d.errorf(ErrTruncated, err, "truncated gzip stream: the file ends inside the gzip header")
	}
	if errors.Is(err, gzip.ErrHeader) {
		return d.errorf(ErrCorrupt, err, "corrupt gzip stream: invalid gzip header")
	}
	return d.errorf(nil, err, "reading the gzip header: %v", err)
}

// gzipStream decompresses a gzip file made of one or more members (as
// `cat a.gz b.gz` makes), like gunzip does. Unlike gzip.Reader in multistream
// mode, it tells a damaged next member (an error) from plain bytes that
// follow the last member (trailing garbage, counted in garbage, after which
// it reports io.EOF).
type gzipStream struct {
	br      *bufio.Reader
	zr      *gzip.Reader
	garbage int64
	done    bool
}

func (g *gzipStream) Read(p []byte) (int, error) {
	if g.done {
		return 0, io.EOF
	}
	for {
		n, err := g.zr.Read(p)
		if err != io.EOF {
			return n, err
		}
		// The member ended and its trailer (CRC-32 and size) checked out.
		next, _ := g.br.Peek(2)
		switch {
		case len(next) == 0:
			g.done = true
			return n, io.EOF
		case len(next) == 2 && next[0] == 0x1f && next[1] == 0x8b:
			if err := g.zr.Reset(g.br); err != nil {
				return n, err
			}
			g.zr.Multistream(false)
			if n > 0 {
				return n, nil
			}
		default:
			const maxCount = 1 << 20
			g.garbage, _ = io.Copy(io.Discard, io.LimitReader(g.br, maxCount+1))
			g.done = true
			return n, io.EOF
		}
	}
}

func plural(n int64, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	return fmt.Sprintf("%d %ss", n, unit)
}

func isFlateError(err error) bool {
	var ce flate.CorruptInputError
	var ie flate.InternalError
	return errors.As(err, &ce) || errors.As(err, &ie)
}

func causeOf(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// remainingSize returns how many bytes are left to read from r, or -1 if
// that cannot be known cheaply.
func remainingSize(r io.Reader) int64 {
	switch v := r.(type) {
	case *os.File:
		fi, err := v.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			return -1
		}
		pos, err := v.Seek(0, io.SeekCurrent)
		if err != nil || pos > fi.Size() {
			return -1
		}
		return fi.Size() - pos
	case interface{ Len() int }:
		return int64(v.Len())
	}
	return -1
}

// convert turns big-endian raw data into a typed slice.
func convert(typ DataType, b []byte) any {
	switch typ {
	case Uint8:
		return b
	case Int8:
		out := make([]int8, len(b))
		for i, v := range b {
			out[i] = int8(v)
		}
		return out
	case Int16:
		out := make([]int16, len(b)/2)
		for i := range out {
			out[i] = int16(binary.BigEndian.Uint16(b[2*i:]))
		}
		return out
	case Int32:
		out := make([]int32, len(b)/4)
		for i := range out {
			out[i] = int32(binary.BigEndian.Uint32(b[4*i:]))
		}
		return out
	case Float32:
		out := make([]float32, len(b)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.BigEndian.Uint32(b[4*i:]))
		}
		return out
	case Float64:
		out := make([]float64, len(b)/8)
		for i := range out {
			out[i] = math.Float64frombits(binary.BigEndian.Uint64(b[8*i:]))
		}
		return out
	}
	panic(fmt.Sprintf("idx: convert called with invalid type %v", typ))
}
