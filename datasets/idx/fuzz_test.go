package idx_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/datasets/idx"
	"github.com/goaccel/goaccel/internal/testing/idxtest"
)

// FuzzRead: whatever the bytes, Read returns an *Error or an array whose data has exactly the product of
// its dimensions elements, of the Go type its header names; it never panics, and never allocates past the
// byte limit it was given (a header claiming 2^32 × 2^32 elements is refused before any allocation). An
// array it accepts encodes back to the same bytes (plain files) or the same array (gzip).
func FuzzRead(f *testing.F) {
	f.Add(idxtest.Encode([]int{3, 2}, []uint8{1, 2, 3, 4, 5, 6}))
	f.Add(idxtest.Encode([]int{2}, []float32{1.5, -2}))
	f.Add(idxtest.Encode([]int{2, 1}, []int16{-7, 300}))
	f.Add(idxtest.Encode([]int{0, 28, 28}, []uint8{}))
	f.Add(idxtest.Gzip(idxtest.Encode([]int{2}, []float64{1, 2})))
	f.Add(idxtest.Header(0x08, 0xffffffff, 0xffffffff))
	f.Add(idxtest.Header(0x0D, 1, 2, 3))
	f.Add([]byte{0, 0, 0x0E})
	f.Add([]byte{0x1f, 0x8b, 0, 0})
	const limit = 1 << 20
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := idx.Read(bytes.NewReader(data), idx.WithMaxBytes(limit))
		if err != nil {
			var idxErr *idx.Error
			assert.True(t, errors.As(err, &idxErr), "every failure is an *idx.Error: %v", err)
			return
		}
		n := 1
		for _, d := range a.Dims {
			require.GreaterOrEqual(t, d, 0)
			n *= d
		}
		assert.Equal(t, n, a.Len())
		assert.LessOrEqual(t, int64(n), int64(limit), "more elements than the byte limit allows")
		wantType := map[idx.DataType]string{idx.Uint8: "[]uint8", idx.Int8: "[]int8", idx.Int16: "[]int16",
			idx.Int32: "[]int32", idx.Float32: "[]float32", idx.Float64: "[]float64"}[a.Type]
		require.NotEmpty(t, wantType, "type %v", a.Type)
		assert.Equal(t, wantType, typeName(a.Data))
		again := idxtest.Encode(a.Dims, a.Data)
		if len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b {
			b, err := idx.Read(bytes.NewReader(again))
			require.NoError(t, err)
			assert.Equal(t, a, b)
			return
		}
		assert.Equal(t, data[:len(again)], again, "an accepted plain file is its array's encoding")
	})
}

func typeName(v any) string {
	switch v.(type) {
	case []uint8:
		return "[]uint8"
	case []int8:
		return "[]int8"
	case []int16:
		return "[]int16"
	case []int32:
		return "[]int32"
	case []float32:
		return "[]float32"
	case []float64:
		return "[]float64"
	}
	return "other"
}
