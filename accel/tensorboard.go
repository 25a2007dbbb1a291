package accel

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// NewTensorBoardTracker writes the metrics Log records as TensorBoard scalars: an event file
// events.out.tfevents.<unix time>.<host> in dir (created on the first Log), which `tensorboard --logdir`
// reads, one scalar series per metric name. Each Log is one event of the step, holding every metric as a
// 32-bit float (TensorBoard's simple_value), written through to the file at once so that a live TensorBoard
// shows it.
//
// A run that starts afresh writes a new file, and leaves earlier files in dir as TensorFlow's and PyTorch's
// writers do (TensorBoard shows them all as one run: give each run a directory of its own). A run resumed
// with LoadState continues the newest event file of dir, without the records logged after the checkpoint.
func NewTensorBoardTracker(dir string) Tracker {
	return &tensorBoardTracker{dir: dir}
}

type tensorBoardTracker struct {
	dir  string
	path string
	file *os.File
}

// tensorBoardFilePrefix starts the name of every TensorBoard event file.
const tensorBoardFilePrefix = "events.out.tfevents."

// tensorBoardFileVersion is the first event of a file: TensorBoard reads only files that declare it.
const tensorBoardFileVersion = "brain.Event:2"

func (t *tensorBoardTracker) Log(step int64, metrics map[string]float64) error {
	if t.file == nil {
		if err := t.create(); err != nil {
			return err
		}
	}
	return t.write(summaryEvent(time.Now(), step, metrics))
}

// create opens a new event file in dir and writes its file-version event.
func (t *tensorBoardTracker) create() error {
	if err := os.MkdirAll(t.dir, 0o755); err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	now := time.Now()
	base := fmt.Sprintf("%s%d.%s", tensorBoardFilePrefix, now.Unix(), host)
	for i := 0; ; i++ {
		name := base
		if i > 0 { // a second tracker in the same directory and second
			name = fmt.Sprintf("%s.%d", base, i)
		}
		path := filepath.Join(t.dir, name)
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("tracker: %w", err)
		}
		t.path, t.file = path, f
		break
	}
	return t.write(fileVersionEvent(now))
}

// write appends one event to the file as a TFRecord.
func (t *tensorBoardTracker) write(event []byte) error {
	if _, err := t.file.Write(appendTFRecord(nil, event)); err != nil {
		return fmt.Errorf("writing %s: %w", t.path, err)
	}
	return nil
}

// Resume continues the newest event file of dir: it rewrites it (atomically) with its events up to the
// records-th scalar event, and appends from there. A last record cut short by a crash is dropped.
func (t *tensorBoardTracker) Resume(records int64) error {
	if t.file != nil {
		return fmt.Errorf("tracker %s: Resume after Log", t.path)
	}
	path, err := newestEventFile(t.dir)
	if err != nil || path == "" {
		return err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	kept, err := keepTensorBoardRecords(data, records)
	if err != nil {
		return fmt.Errorf("tracker %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data[:kept], 0o644); err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	if kept == 0 { // not even the file-version event: the next Log starts a new file
		return os.Remove(path)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	t.path, t.file = path, f
	return nil
}

func (t *tensorBoardTracker) Close() error {
	if t.file == nil {
		return nil
	}
	err := t.file.Close()
	t.file = nil
	return err
}

// newestEventFile is the event file of dir with the latest time in its name ("" if none).
func newestEventFile(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("tracker: %w", err)
	}
	type candidate struct {
		name string
		time int64
	}
	var files []candidate
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), tensorBoardFilePrefix)
		if !ok || !e.Type().IsRegular() || strings.HasSuffix(rest, ".tmp") {
			continue
		}
		stamp, _, _ := strings.Cut(rest, ".")
		sec, err := strconv.ParseInt(stamp, 10, 64)
		if err != nil {
			continue
		}
		files = append(files, candidate{e.Name(), sec})
	}
	if len(files) == 0 {
		return "", nil
	}
	newest := slices.MaxFunc(files, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.time, b.time), strings.Compare(a.name, b.name))
	})
	return filepath.Join(dir, newest.name), nil
}

// keepTensorBoardRecords returns the length of data's prefix that holds its events up to the records-th
// one with a summary (what Log writes), all of them if it has fewer. A record cut short at the end is left
// out; a damaged one elsewhere is an error.
func keepTensorBoardRecords(data []byte, records int64) (int, error) {
	kept, seen := 0, int64(0)
	for pos := 0; pos < len(data); {
		event, next, err := readTFRecord(data, pos)
		if errors.Is(err, errTFRecordCut) {
			break
		}
		if err != nil {
			return 0, err
		}
		if eventHasSummary(event) {
			if seen == records {
				break
			}
			seen++
		}
		kept, pos = next, next
	}
	return kept, nil
}

// TensorBoard's Event and Summary messages (tensorflow/core/util/event.proto, summary.proto): the fields
// the tracker writes.
const (
	eventWallTime    protowire.Number = 1 // double, seconds since the Unix epoch
	eventStep        protowire.Number = 2 // int64
	eventFileVersion protowire.Number = 3 // string
	eventSummary     protowire.Number = 5 // Summary
	summaryValue     protowire.Number = 1 // repeated Summary.Value
	valueTag         protowire.Number = 1 // string
	valueSimpleValue protowire.Number = 2 // float
)

func appendWallTime(b []byte, t time.Time) []byte {
	b = protowire.AppendTag(b, eventWallTime, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, math.Float64bits(float64(t.UnixNano())/1e9))
}

// fileVersionEvent is a file's first event.
func fileVersionEvent(t time.Time) []byte {
	b := appendWallTime(nil, t)
	b = protowire.AppendTag(b, eventFileVersion, protowire.BytesType)
	return protowire.AppendString(b, tensorBoardFileVersion)
}

// summaryEvent is the event of one Log: the step and each metric as a simple value, by name.
func summaryEvent(t time.Time, step int64, metrics map[string]float64) []byte {
	var summary []byte
	for _, name := range slices.Sorted(maps.Keys(metrics)) {
		var value []byte
		value = protowire.AppendTag(value, valueTag, protowire.BytesType)
		value = protowire.AppendString(value, name)
		value = protowire.AppendTag(value, valueSimpleValue, protowire.Fixed32Type)
		value = protowire.AppendFixed32(value, math.Float32bits(float32(metrics[name])))
		summary = protowire.AppendTag(summary, summaryValue, protowire.BytesType)
		summary = protowire.AppendBytes(summary, value)
	}
	b := appendWallTime(nil, t)
	b = protowire.AppendTag(b, eventStep, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(step))
	b = protowire.AppendTag(b, eventSummary, protowire.BytesType)
	return protowire.AppendBytes(b, summary)
}

// eventHasSummary reports whether an event carries a summary; a malformed event counts as one without.
func eventHasSummary(event []byte) bool {
	for len(event) > 0 {
		num, typ, n := protowire.ConsumeTag(event)
		if n < 0 {
			return false
		}
		if num == eventSummary && typ == protowire.BytesType {
			return true
		}
		event = event[n:]
		m := protowire.ConsumeFieldValue(num, typ, event)
		if m < 0 {
			return false
		}
		event = event[m:]
	}
	return false
}

// TFRecord framing: the data's length (uint64, little-endian), the masked CRC-32C of those 8 bytes, the
// data, the masked CRC-32C of the data.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func maskedCRC(data []byte) uint32 {
	crc := crc32.Checksum(data, castagnoli)
	return (crc>>15 | crc<<17) + 0xa282ead8
}

func appendTFRecord(b, data []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(data)))
	b = binary.LittleEndian.AppendUint32(b, maskedCRC(b[len(b)-8:]))
	b = append(b, data...)
	return binary.LittleEndian.AppendUint32(b, maskedCRC(data))
}

// errTFRecordCut is a record that the data ends inside of.
var errTFRecordCut = errors.New("record cut short")

// readTFRecord reads the record at data[pos:], returning its data and the position after it.
func readTFRecord(data []byte, pos int) (record []byte, next int, err error) {
	if len(data)-pos < 12 {
		return nil, 0, errTFRecordCut
	}
	header := data[pos : pos+8]
	if binary.LittleEndian.Uint32(data[pos+8:]) != maskedCRC(header) {
		return nil, 0, fmt.Errorf("record at byte %d: its length's checksum does not match", pos)
	}
	length := binary.LittleEndian.Uint64(header)
	if avail := len(data) - pos - 16; avail < 0 || length > uint64(avail) {
		return nil, 0, errTFRecordCut
	}
	start := pos + 12
	end := start + int(length)
	record = data[start:end]
	if binary.LittleEndian.Uint32(data[end:]) != maskedCRC(record) {
		return nil, 0, fmt.Errorf("record at byte %d: its data's checksum does not match", pos)
	}
	return record, end + 4, nil
}
