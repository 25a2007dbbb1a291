// Command tracepng draws a trace-event JSON file (a goaccel timeline) as a PNG: one band per process, a
// row per track, the slices labelled. It is how docs/images/timeline.png is made:
//
//	go run ./internal/traceevent/tracepng -from 120 -to 180 -o docs/images/timeline.png timeline.json
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/goaccel/goaccel/internal/traceevent"
)

func main() {
	out := flag.String("o", "timeline.png", "write the image to `FILE`")
	from := flag.Float64("from", 0, "draw from `MS` milliseconds into the trace")
	to := flag.Float64("to", 0, "draw up to `MS` milliseconds into the trace (0: the end)")
	width := flag.Int("width", 1600, "the image's width in `PIXELS`")
	title := flag.String("title", "", "a `TITLE` above the rows")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: tracepng [-o FILE] [-from MS] [-to MS] [-width PIXELS] [-title TITLE] TRACE.json")
		os.Exit(2)
	}
	f, err := traceevent.ReadFile(flag.Arg(0))
	if err == nil {
		var b bytes.Buffer
		err = traceevent.Render(&b, f, traceevent.RenderOptions{From: *from * 1000, To: *to * 1000, Width: *width, Title: *title})
		if err == nil {
			err = traceevent.WriteAtomically(*out, b.Bytes())
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "tracepng: %v\n", err)
		os.Exit(1)
	}
}
