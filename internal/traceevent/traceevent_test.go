package traceevent

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func slice(pid, tid int, name string, ts, dur float64) Event {
	return Event{Name: name, Ph: PhaseComplete, Pid: pid, Tid: tid, Ts: ts, Dur: dur}
}

func TestMerge(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []File
		want  []Event
		other map[string]any
	}{
		{name: "nothing", files: nil, want: nil},
		{
			name: "two ranks: metadata first, times from the earliest, in order",
			files: []File{
				{TraceEvents: []Event{slice(0, 1, "a", 1500, 10), ProcessName(0, "rank 0"), slice(0, 1, "b", 1200, 5)},
					OtherData: map[string]any{"rank 0 clock": 0.0}},
				{TraceEvents: []Event{ProcessName(1, "rank 1"), slice(1, 1, "c", 1000, 700)},
					OtherData: map[string]any{"rank 1 clock": 2.5}},
			},
			want: []Event{ProcessName(0, "rank 0"), ProcessName(1, "rank 1"), slice(1, 1, "c", 0, 700),
				slice(0, 1, "b", 200, 5), slice(0, 1, "a", 500, 10)},
			other: map[string]any{"rank 0 clock": 0.0, "rank 1 clock": 2.5},
		},
		{
			name:  "negative times move to 0; equal times keep their order",
			files: []File{{TraceEvents: []Event{slice(0, 1, "x", -20, 1), slice(0, 2, "y", -20, 2), slice(0, 1, "z", 0, 1)}}},
			want:  []Event{slice(0, 1, "x", 0, 1), slice(0, 2, "y", 0, 2), slice(0, 1, "z", 20, 1)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Merge(tc.files...)
			assert.Equal(t, tc.want, got.TraceEvents)
			assert.Equal(t, tc.other, got.OtherData)
			assert.Equal(t, "ms", got.DisplayTimeUnit)
		})
	}
}

func TestEncodeDecode(t *testing.T) {
	f := File{TraceEvents: []Event{ProcessName(3, "rank 3"), ThreadName(3, 2, "data loading"),
		{Name: "restart 1", Ph: PhaseInstant, Scope: "p", Ts: 7, Pid: 3, Tid: 1},
		{Name: "all-reduce bucket 0 (4.0 KiB)", Cat: "collective", Ph: PhaseComplete, Ts: 10, Dur: 2.5, Pid: 3,
			Tid: 100, Args: map[string]any{"seq": 4.0}}}}
	data, err := Encode(f)
	require.NoError(t, err)
	got, err := Decode(data)
	require.NoError(t, err)
	assert.Equal(t, f.TraceEvents, got.TraceEvents)
	for _, tc := range []struct {
		name, data string
		events     int
		err        string
	}{
		{"object", `{"traceEvents":[{"name":"a","ph":"X","ts":1,"dur":2,"pid":0,"tid":1}]}`, 1, ""},
		{"bare array", `[{"name":"a","ph":"X","ts":1,"pid":0,"tid":1},{"name":"b","ph":"i","ts":1,"pid":0,"tid":1}]`, 2, ""},
		{"empty trace", `{"traceEvents":[]}`, 0, ""},
		{"no events", `{"other":1}`, 0, "no traceEvents"},
		{"not JSON", `{"traceEvents":`, 0, "not a trace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Decode([]byte(tc.data))
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Len(t, f.TraceEvents, tc.events)
		})
	}
	empty, err := Encode(File{})
	require.NoError(t, err)
	assert.JSONEq(t, `{"traceEvents":[]}`, string(empty), "an empty trace still opens")
}

func TestWriteFileReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.json")
	require.NoError(t, os.WriteFile(path, []byte("old"), 0o644))
	require.NoError(t, WriteFile(path, File{TraceEvents: []Event{slice(0, 1, "a", 0, 1)}}))
	f, err := ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, []Event{slice(0, 1, "a", 0, 1)}, f.TraceEvents)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temporary file left")
	assert.Error(t, WriteFile(filepath.Join(dir, "missing", "t.json"), File{}), "a directory that does not exist")
}

// TestLayoutDepths: slices that hold others are drawn above them; slices that only touch share a depth.
func TestLayoutDepths(t *testing.T) {
	f := File{TraceEvents: []Event{
		ThreadName(0, 1, "training"), ProcessName(0, "rank 0"),
		slice(0, 1, "inner", 10, 5), slice(0, 1, "outer", 0, 50), slice(0, 1, "inner 2", 20, 10),
		slice(0, 1, "innermost", 22, 2), slice(0, 1, "next", 50, 10), slice(1, 3, "other rank", 0, 1),
	}}
	names, _, tracks := layout(f)
	require.Len(t, tracks, 2)
	assert.Equal(t, "rank 0", names[0])
	assert.Equal(t, "process 1", names[1], "a process without a name")
	tr := tracks[0]
	assert.Equal(t, "training", tr.name)
	depth := map[string]int{}
	for i, e := range tr.slices {
		depth[e.Name] = tr.depth[i]
	}
	assert.Equal(t, map[string]int{"outer": 0, "inner": 1, "inner 2": 1, "innermost": 2, "next": 0}, depth)
	assert.Equal(t, 3, tr.depths)
}

func TestRender(t *testing.T) {
	f := File{TraceEvents: []Event{ProcessName(0, "rank 0"), ProcessName(1, "rank 1"),
		ThreadName(0, 1, "training"), ThreadName(1, 1, "training"),
		slice(0, 1, "micro-batch 1 (syncs)", 0, 9000), slice(0, 1, "forward+backward 1", 100, 6000),
		slice(1, 1, "micro-batch 1 (syncs)", 200, 8800), slice(1, 100, "all-reduce bucket 0 (4.0 KiB)", 6500, 2000),
		{Name: "restart 1", Ph: PhaseInstant, Ts: 0, Pid: 0, Tid: 1}}}
	var b bytes.Buffer
	require.NoError(t, Render(&b, f, RenderOptions{Width: 800, Title: "two ranks"}))
	img, err := png.Decode(&b)
	require.NoError(t, err)
	assert.Equal(t, 800, img.Bounds().Dx())
	// The title, the axis, two bands, three tracks.
	assert.Greater(t, img.Bounds().Dy(), 5*sliceH)
	colors := map[[3]uint32]bool{}
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y++ {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			colors[[3]uint32{r >> 8, g >> 8, bl >> 8}] = true
		}
	}
	assert.Greater(t, len(colors), 4, "slices, text and background drawn")
	assert.Error(t, Render(&b, File{TraceEvents: []Event{ProcessName(0, "rank 0")}}, RenderOptions{}),
		"no slices: nothing to draw")
}

func TestGlyphs(t *testing.T) {
	for r, rows := range glyphRows {
		assert.Len(t, rows, glyphH*glyphW+glyphH-1, "glyph %q: 7 rows of 5", r)
	}
	assert.Equal(t, uint8(0b11111), glyphs['-'][3])
	assert.Zero(t, glyphs[' '][0])
}
