package traceevent

import (
	"fmt"
	"hash/fnv"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"slices"
	"strings"
	"unicode"
)

// RenderOptions say what part of a trace Render draws, and how large.
type RenderOptions struct {
	// From and To bound the time drawn, in the trace's microseconds; To <= From draws the whole trace.
	From, To float64
	// Width is the image's width in pixels (default 1600).
	Width int
	// Title is written above the rows.
	Title string
}

// Layout of the drawing, in pixels (before Scale).
const (
	scale      = 2 // each font pixel is scale×scale
	gutter     = 150
	margin     = 8
	rowPad     = 3
	sliceH     = 2*glyphH + 6 // a slice is tall enough for one line of text at scale 2
	headerH    = sliceH + 4
	axisH      = 26
	minLabelPx = 3 * advance * scale
)

var (
	background = color.RGBA{255, 255, 255, 255}
	textColor  = color.RGBA{20, 20, 20, 255}
	gridColor  = color.RGBA{225, 225, 225, 255}
	rankColor  = color.RGBA{238, 238, 245, 255}
	// categoryColors color slices by their event category; anything else gets a color from its name.
	categoryColors = map[string]color.RGBA{
		"compute":    {125, 170, 230, 255},
		"step":       {190, 215, 245, 255},
		"optimizer":  {150, 210, 150, 255},
		"collective": {245, 175, 90, 255},
		"wait":       {235, 110, 110, 255},
		"load":       {190, 160, 225, 255},
		"checkpoint": {120, 200, 200, 255},
	}
)

// track is one row of the drawing: a thread of a process, with its slices placed at their depths.
type track struct {
	pid, tid int
	name     string
	sort     int
	slices   []Event
	depth    []int
	depths   int
	instants []Event
}

// Render draws f as a PNG: one band per process (in process_sort_index order), one row per thread
// within it, the slices as colored boxes nested by depth and labelled where they are wide enough, the
// instant events as marks, and a time axis in milliseconds.
func Render(w io.Writer, f File, opt RenderOptions) error {
	if opt.Width <= 0 {
		opt.Width = 1600
	}
	procNames, procSort, tracks := layout(f)
	if len(tracks) == 0 {
		return fmt.Errorf("traceevent: nothing to draw: the trace has no slices")
	}
	from, to := opt.From, opt.To
	if to <= from {
		from, to = math.Inf(1), math.Inf(-1)
		for _, t := range tracks {
			for _, e := range t.slices {
				from, to = min(from, e.Ts), max(to, e.End())
			}
			for _, e := range t.instants {
				from, to = min(from, e.Ts), max(to, e.Ts)
			}
		}
		if to <= from {
			to = from + 1
		}
	}
	// Height: the title, the axis, and per process a header and its tracks.
	height := margin + axisH
	if opt.Title != "" {
		height += headerH
	}
	pids := processOrder(tracks, procSort)
	for _, pid := range pids {
		height += headerH
		for _, t := range tracks {
			if t.pid == pid {
				height += t.depths*sliceH + 2*rowPad
			}
		}
	}
	height += margin
	img := image.NewRGBA(image.Rect(0, 0, opt.Width, height))
	draw.Draw(img, img.Bounds(), &image.Uniform{background}, image.Point{}, draw.Src)
	plotL, plotR := gutter, opt.Width-margin
	x := func(ts float64) int { return plotL + int(math.Round((ts-from)/(to-from)*float64(plotR-plotL))) }

	y := margin
	if opt.Title != "" {
		drawText(img, margin, y+3, opt.Title, textColor, opt.Width)
		y += headerH
	}
	// Axis: a tick every "nice" number of milliseconds, about 10 across.
	step := niceStep((to - from) / 1000 / 10)
	for ms := math.Ceil(from/1000/step) * step; ms*1000 <= to; ms += step {
		tx := x(ms * 1000)
		fillRect(img, tx, y+axisH-6, tx+1, height-margin, gridColor)
		drawText(img, tx+2, y+2, trimFloat(ms)+" MS", textColor, plotR)
	}
	y += axisH
	for _, pid := range pids {
		fillRect(img, 0, y, opt.Width, y+headerH, rankColor)
		drawText(img, margin, y+3, procNames[pid], textColor, gutter)
		y += headerH
		for _, t := range tracks {
			if t.pid != pid {
				continue
			}
			h := t.depths*sliceH + 2*rowPad
			fillRect(img, 0, y+h-1, opt.Width, y+h, gridColor)
			drawText(img, margin+4, y+rowPad+2, t.name, textColor, gutter-4)
			for i, e := range t.slices {
				if e.End() < from || e.Ts > to {
					continue
				}
				x0, x1 := max(x(e.Ts), plotL), min(x(e.End()), plotR)
				if x1 <= x0 {
					x1 = x0 + 1
				}
				top := y + rowPad + t.depth[i]*sliceH
				c := sliceColor(e)
				fillRect(img, x0, top, x1, top+sliceH-1, c)
				if x1-x0 >= minLabelPx {
					drawText(img, x0+2, top+3, e.Name, textColor, x1-2)
				}
			}
			for _, e := range t.instants {
				if e.Ts < from || e.Ts > to {
					continue
				}
				ix := x(e.Ts)
				fillRect(img, ix-1, y, ix+2, y+h, textColor)
				drawText(img, ix+4, y+rowPad+2, e.Name, textColor, plotR)
			}
			y += h
		}
	}
	return png.Encode(w, img)
}

// layout groups f's events into tracks and places each track's slices at their nesting depth.
func layout(f File) (procNames map[int]string, procSort map[int]int, tracks []*track) {
	procNames, procSort = map[int]string{}, map[int]int{}
	byKey := map[[2]int]*track{}
	get := func(pid, tid int) *track {
		k := [2]int{pid, tid}
		if t := byKey[k]; t != nil {
			return t
		}
		t := &track{pid: pid, tid: tid, name: fmt.Sprintf("thread %d", tid), sort: tid}
		byKey[k] = t
		tracks = append(tracks, t)
		return t
	}
	for _, e := range f.TraceEvents {
		switch e.Ph {
		case PhaseMetadata:
			switch e.Name {
			case "process_name":
				procNames[e.Pid] = fmt.Sprint(e.Args["name"])
			case "process_sort_index":
				procSort[e.Pid] = toInt(e.Args["sort_index"])
			case "thread_name":
				get(e.Pid, e.Tid).name = fmt.Sprint(e.Args["name"])
			case "thread_sort_index":
				get(e.Pid, e.Tid).sort = toInt(e.Args["sort_index"])
			}
		case PhaseComplete:
			t := get(e.Pid, e.Tid)
			t.slices = append(t.slices, e)
		case PhaseInstant:
			t := get(e.Pid, e.Tid)
			t.instants = append(t.instants, e)
		}
	}
	for _, t := range tracks {
		if _, ok := procNames[t.pid]; !ok {
			procNames[t.pid] = fmt.Sprintf("process %d", t.pid)
		}
		// Longer slices first at equal starts, so that a parent comes before the children it holds.
		slices.SortStableFunc(t.slices, func(a, b Event) int {
			if a.Ts != b.Ts {
				return cmpFloat(a.Ts, b.Ts)
			}
			return cmpFloat(b.Dur, a.Dur)
		})
		t.depth = make([]int, len(t.slices))
		var open []float64 // ends of the slices that hold the current one
		for i, e := range t.slices {
			for len(open) > 0 && open[len(open)-1] <= e.Ts {
				open = open[:len(open)-1]
			}
			t.depth[i] = len(open)
			open = append(open, e.End())
			t.depths = max(t.depths, len(open))
		}
		t.depths = max(t.depths, 1)
	}
	tracks = slices.DeleteFunc(tracks, func(t *track) bool { return len(t.slices) == 0 && len(t.instants) == 0 })
	slices.SortStableFunc(tracks, func(a, b *track) int {
		if a.pid != b.pid {
			return procSort[a.pid]*1000003 + a.pid - (procSort[b.pid]*1000003 + b.pid)
		}
		return a.sort - b.sort
	})
	return procNames, procSort, tracks
}

func processOrder(tracks []*track, procSort map[int]int) []int {
	var pids []int
	for _, t := range tracks {
		if !slices.Contains(pids, t.pid) {
			pids = append(pids, t.pid)
		}
	}
	return pids
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func toInt(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case float64:
		return int(n)
	}
	return 0
}

func sliceColor(e Event) color.RGBA {
	if c, ok := categoryColors[e.Cat]; ok {
		return c
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(e.Name))
	v := h.Sum32()
	return color.RGBA{uint8(140 + v%100), uint8(140 + v/100%100), uint8(140 + v/10000%100), 255}
}

// niceStep rounds a step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

func fillRect(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	draw.Draw(img, image.Rect(x0, y0, x1, y1), &image.Uniform{c}, image.Point{}, draw.Src)
}

// drawText writes s from (x, y), its top left, in the built-in font at scale, stopping before limit.
func drawText(img *image.RGBA, x, y int, s string, c color.RGBA, limit int) {
	for _, r := range s {
		if x+glyphW*scale > limit {
			return
		}
		g, ok := glyphs[unicode.ToUpper(r)]
		if !ok {
			g = glyphs['?']
		}
		for row := range glyphH {
			for col := range glyphW {
				if g[row]&(1<<(glyphW-1-col)) != 0 {
					fillRect(img, x+col*scale, y+row*scale, x+(col+1)*scale, y+(row+1)*scale, c)
				}
			}
		}
		x += advance * scale
	}
}

// DrawText writes s from (x, y), its top left, in the built-in 5×7 font (capitals, digits and the
// punctuation of glyphRows) at the renderer's scale, and returns the width it took: other stdlib-only
// drawings (accelbench's plots) label themselves with the timeline's font.
func DrawText(img *image.RGBA, x, y int, s string, c color.RGBA) int {
	drawText(img, x, y, s, c, img.Bounds().Max.X)
	return TextWidth(s)
}

// TextWidth is the width DrawText takes for s, and TextHeight the height of a line.
func TextWidth(s string) int { return len([]rune(s)) * advance * scale }

// TextHeight is the height of a line of DrawText.
const TextHeight = glyphH * scale
