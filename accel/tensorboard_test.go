package accel_test

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/goaccel/goaccel/accel"
)

// tbEvent is what the test reads back of a tensorflow.Event.
type tbEvent struct {
	wallTime    float64
	step        int64
	fileVersion string
	values      []tbValue // the summary's, in order
	hasSummary  bool
}

type tbValue struct {
	tag   string
	value float32
}

// readEventFile parses a TensorBoard event file the way TensorBoard does: TFRecord frames (length, masked
// CRC-32C of the length, data, masked CRC-32C of the data), each a serialized tensorflow.Event.
func readEventFile(t *testing.T, path string) []tbEvent {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	table := crc32.MakeTable(crc32.Castagnoli)
	masked := func(b []byte) uint32 {
		crc := crc32.Checksum(b, table)
		return ((crc >> 15) | (crc << 17)) + 0xa282ead8
	}
	var events []tbEvent
	for len(data) > 0 {
		require.GreaterOrEqual(t, len(data), 12, "truncated header")
		length := binary.LittleEndian.Uint64(data)
		require.Equal(t, masked(data[:8]), binary.LittleEndian.Uint32(data[8:]), "length CRC")
		require.GreaterOrEqual(t, uint64(len(data)-16), length, "truncated record")
		record := data[12 : 12+length]
		require.Equal(t, masked(record), binary.LittleEndian.Uint32(data[12+length:]), "data CRC")
		data = data[16+length:]
		events = append(events, parseEvent(t, record))
	}
	return events
}

func parseEvent(t *testing.T, b []byte) tbEvent {
	t.Helper()
	var e tbEvent
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		require.Positive(t, n)
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.Fixed64Type:
			v, n := protowire.ConsumeFixed64(b)
			require.Positive(t, n)
			e.wallTime, b = math.Float64frombits(v), b[n:]
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			require.Positive(t, n)
			e.step, b = int64(v), b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeString(b)
			require.Positive(t, n)
			e.fileVersion, b = v, b[n:]
		case num == 5 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			require.Positive(t, n)
			e.hasSummary, e.values, b = true, parseSummary(t, v), b[n:]
		default:
			t.Fatalf("unexpected Event field %d (wire type %d)", num, typ)
		}
	}
	return e
}

func parseSummary(t *testing.T, b []byte) []tbValue {
	var values []tbValue
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		require.Positive(t, n)
		require.Equal(t, protowire.Number(1), num, "Summary.value")
		require.Equal(t, protowire.BytesType, typ)
		v, m := protowire.ConsumeBytes(b[n:])
		require.Positive(t, m)
		b = b[n+m:]
		var value tbValue
		for len(v) > 0 {
			num, typ, n := protowire.ConsumeTag(v)
			require.Positive(t, n)
			v = v[n:]
			switch {
			case num == 1 && typ == protowire.BytesType:
				s, n := protowire.ConsumeString(v)
				require.Positive(t, n)
				value.tag, v = s, v[n:]
			case num == 2 && typ == protowire.Fixed32Type:
				f, n := protowire.ConsumeFixed32(v)
				require.Positive(t, n)
				value.value, v = math.Float32frombits(f), v[n:]
			default:
				t.Fatalf("unexpected Summary.Value field %d (wire type %d)", num, typ)
			}
		}
		values = append(values, value)
	}
	return values
}

// eventFiles lists dir's event files.
func eventFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*"))
	require.NoError(t, err)
	return files
}

// scalars are the (step, tag, value) of the events that carry a summary.
func scalars(events []tbEvent) []string {
	var out []string
	for _, e := range events {
		for _, v := range e.values {
			out = append(out, fmt.Sprintf("%d %s=%g", e.step, v.tag, v.value))
		}
	}
	return out
}

// TestTensorBoardTrackerWritesEvents: Log through the accelerator writes one event file named as
// TensorFlow names them, whose first event declares the file version and whose next events hold each
// Log's step and metrics as simple values, sorted by name.
func TestTensorBoardTrackerWritesEvents(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tb")
	before := time.Now()
	acc := newSingle(t, accel.WithTrackers(accel.NewTensorBoardTracker(dir)))
	require.NoError(t, acc.Log(1, map[string]float64{"loss": 0.5, "accuracy": 0.25}))
	require.NoError(t, acc.Log(2, map[string]float64{"loss": 0.125}))
	require.NoError(t, acc.Log(40, map[string]float64{"loss": math.Inf(1), "lr": 1e-3}))
	require.NoError(t, acc.Close())

	files := eventFiles(t, dir)
	require.Len(t, files, 1)
	host, err := os.Hostname()
	require.NoError(t, err)
	assert.Regexp(t, `^events\.out\.tfevents\.\d{10}\.`+regexp.QuoteMeta(host)+`$`, filepath.Base(files[0]))

	events := readEventFile(t, files[0])
	require.Len(t, events, 4)
	assert.Equal(t, "brain.Event:2", events[0].fileVersion)
	assert.False(t, events[0].hasSummary)
	for _, e := range events {
		assert.InDelta(t, float64(before.UnixNano())/1e9, e.wallTime, 60, "wall time in seconds")
	}
	assert.Equal(t, []string{"1 accuracy=0.25", "1 loss=0.5", "2 loss=0.125", "40 loss=+Inf", "40 lr=0.001"},
		scalars(events))
	assert.Equal(t, float32(1e-3), events[3].values[1].value, "float32, as TensorBoard's simple_value")
}

// TestTensorBoardTrackerResume: a resumed tracker continues the newest event file without the records
// logged after the checkpoint, and drops a record cut short by a crash; a tracker that is not resumed
// starts a file of its own.
func TestTensorBoardTrackerResume(t *testing.T) {
	dir := t.TempDir()
	first := accel.NewTensorBoardTracker(dir)
	for step := int64(1); step <= 5; step++ {
		require.NoError(t, first.Log(step, map[string]float64{"loss": float64(step)}))
	}
	require.NoError(t, first.Close())
	files := eventFiles(t, dir)
	require.Len(t, files, 1)
	// A crash in the middle of a write: half a record at the end.
	f, err := os.OpenFile(files[0], os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte{40, 0, 0, 0, 0, 0, 0, 0, 1, 2})
	require.NoError(t, err)
	require.NoError(t, f.Close())

	resumed := accel.NewTensorBoardTracker(dir)
	require.NoError(t, resumed.Resume(3))
	require.NoError(t, resumed.Log(4, map[string]float64{"loss": 40}))
	require.NoError(t, resumed.Close())
	require.Equal(t, files, eventFiles(t, dir), "the same file, continued")
	events := readEventFile(t, files[0])
	assert.Equal(t, "brain.Event:2", events[0].fileVersion)
	assert.Equal(t, []string{"1 loss=1", "2 loss=2", "3 loss=3", "4 loss=40"}, scalars(events))

	// Resuming with more records than the file holds keeps them all.
	again := accel.NewTensorBoardTracker(dir)
	require.NoError(t, again.Resume(10))
	require.NoError(t, again.Close())
	assert.Len(t, scalars(readEventFile(t, files[0])), 4)

	// A damaged record is refused, and the file left as it is.
	data, err := os.ReadFile(files[0])
	require.NoError(t, err)
	damaged := append([]byte(nil), data...)
	damaged[len(damaged)-6] ^= 0xff
	require.NoError(t, os.WriteFile(files[0], damaged, 0o644))
	require.ErrorContains(t, accel.NewTensorBoardTracker(dir).Resume(10), "checksum")
	got, err := os.ReadFile(files[0])
	require.NoError(t, err)
	assert.Equal(t, damaged, got)
	require.NoError(t, os.WriteFile(files[0], data, 0o644))

	// Not resumed: a file of its own beside the first (a second later at most, so the names differ even
	// within the same second).
	fresh := accel.NewTensorBoardTracker(dir)
	require.NoError(t, fresh.Log(1, map[string]float64{"loss": 9}))
	require.NoError(t, fresh.Close())
	files = eventFiles(t, dir)
	require.Len(t, files, 2)
	var freshFile string
	for _, f := range files {
		if len(scalars(readEventFile(t, f))) == 1 {
			freshFile = f
		}
	}
	require.NotEmpty(t, freshFile)
	assert.Equal(t, []string{"1 loss=9"}, scalars(readEventFile(t, freshFile)))

	// Resume of an empty directory, or with no record kept, starts afresh.
	empty := t.TempDir()
	none := accel.NewTensorBoardTracker(empty)
	require.NoError(t, none.Resume(0))
	require.NoError(t, none.Log(1, map[string]float64{"loss": 1}))
	require.NoError(t, none.Close())
	require.Len(t, eventFiles(t, empty), 1)
}

func ExampleNewTensorBoardTracker() {
	dir, _ := os.MkdirTemp("", "goaccel-tb")
	defer os.RemoveAll(dir)
	acc, _ := accel.New(accel.WithTrackers(accel.NewTensorBoardTracker(filepath.Join(dir, "tb")),
		accel.NewCSVTracker(filepath.Join(dir, "log.csv"))))
	for step := int64(1); step <= 3; step++ {
		_ = acc.Log(step, map[string]float64{"loss": 1 / float64(step)})
	}
	_ = acc.Close()
	files, _ := filepath.Glob(filepath.Join(dir, "tb", "events.out.tfevents.*"))
	info, _ := os.Stat(files[0])
	fmt.Println(len(files), "event file,", info.Size(), "bytes")
	// Output:
	// 1 event file, 166 bytes
}
