package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"os"

	"github.com/goaccel/goaccel/internal/traceevent"
)

// The projection's plot: one panel per rate, scaling efficiency (0 to 1) against the number of processes
// (log scale), a line per mode. Drawn with the standard library and the timeline's font, so that the page's
// image needs nothing to build.
const (
	plotPanelW, plotPanelH = 520, 360
	plotLeft, plotRight    = 70, 20
	plotTop, plotBottom    = 50, 60
	plotLegendH            = 40
)

var (
	plotBackground = color.RGBA{255, 255, 255, 255}
	plotInk        = color.RGBA{20, 20, 20, 255}
	plotGrid       = color.RGBA{225, 225, 225, 255}
	// plotColors color the modes, in scalingModes' order.
	plotColors = []color.RGBA{{200, 60, 50, 255}, {230, 150, 30, 255}, {50, 110, 200, 255}, {40, 160, 80, 255},
		{140, 80, 180, 255}}
)

// writeScalingPNG draws curves to path.
func writeScalingPNG(path string, curves []scalingCurve, p networkPlan) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := drawScaling(f, curves, p); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// drawScaling encodes the plot of curves as a PNG.
func drawScaling(w io.Writer, curves []scalingCurve, p networkPlan) error {
	var rates []int64
	for _, c := range curves {
		if len(rates) == 0 || rates[len(rates)-1] != c.RateBits {
			rates = append(rates, c.RateBits)
		}
	}
	if len(rates) == 0 {
		return fmt.Errorf("scaling plot: no curves")
	}
	width := len(rates) * (plotLeft + plotPanelW + plotRight)
	height := plotTop + plotPanelH + plotBottom + plotLegendH
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), &image.Uniform{plotBackground}, image.Point{}, draw.Src)
	for i, rate := range rates {
		x0 := i*(plotLeft+plotPanelW+plotRight) + plotLeft
		drawPanel(img, x0, plotTop, rate, curves)
	}
	// The legend, under the panels: a swatch and the mode's name each.
	x, y := plotLeft, plotTop+plotPanelH+plotBottom
	for i, mode := range scalingModes {
		fill(img, x, y+4, x+24, y+8, plotColors[i%len(plotColors)])
		x += 32 + traceevent.DrawText(img, x+32, y, modeName(mode, p), plotInk) + 40
	}
	return png.Encode(w, img)
}

// drawPanel draws one rate's curves with their axes in the panel whose plotting area starts at (x0, y0).
func drawPanel(img *image.RGBA, x0, y0 int, rate int64, curves []scalingCurve) {
	title := "SCALING EFFICIENCY AT " + formatBits(float64(rate))
	traceevent.DrawText(img, x0+(plotPanelW-traceevent.TextWidth(title))/2, y0-32, title, plotInk)
	px := func(i int) int { return x0 + i*plotPanelW/(len(scalingProcs)-1) } // log2 steps, evenly spaced
	py := func(e float64) int { return y0 + plotPanelH - int(math.Round(math.Max(0, math.Min(1, e))*plotPanelH)) }
	for tick := 0; tick <= 5; tick++ {
		e := float64(tick) / 5
		fill(img, x0, py(e), x0+plotPanelW, py(e)+1, plotGrid)
		label := fmt.Sprintf("%.1f", e)
		traceevent.DrawText(img, x0-traceevent.TextWidth(label)-8, py(e)-traceevent.TextHeight/2, label, plotInk)
	}
	for i, n := range scalingProcs {
		fill(img, px(i), y0, px(i)+1, y0+plotPanelH, plotGrid)
		label := fmt.Sprint(n)
		traceevent.DrawText(img, px(i)-traceevent.TextWidth(label)/2, y0+plotPanelH+8, label, plotInk)
	}
	axis := "PROCESSES, ONE PER HOST"
	traceevent.DrawText(img, x0+(plotPanelW-traceevent.TextWidth(axis))/2, y0+plotPanelH+30, axis, plotInk)
	fill(img, x0, y0, x0+1, y0+plotPanelH+1, plotInk)
	fill(img, x0, y0+plotPanelH, x0+plotPanelW+1, y0+plotPanelH+1, plotInk)
	for _, c := range curves {
		if c.RateBits != rate {
			continue
		}
		col := plotColors[modeIndex(c.Mode)%len(plotColors)]
		// DiLoCo moves what local SGD moves, so their lines coincide: local SGD's is drawn wide, DiLoCo's
		// dashed on top of it, so that both show.
		width, dash := 3, 0
		switch c.Mode {
		case modeLocalSGD:
			width = 7
		case modeDiLoCo:
			dash = 10
		}
		for i := 1; i < len(c.Efficiency); i++ {
			line(img, px(i-1), py(c.Efficiency[i-1]), px(i), py(c.Efficiency[i]), col, width, dash)
		}
		for i, e := range c.Efficiency {
			fill(img, px(i)-3, py(e)-3, px(i)+4, py(e)+4, col)
		}
	}
}

// modeIndex is the mode's place in scalingModes, which picks its color.
func modeIndex(mode string) int {
	for i, m := range scalingModes {
		if m == mode {
			return i
		}
	}
	return 0
}

func fill(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	draw.Draw(img, image.Rect(x0, y0, x1, y1), &image.Uniform{c}, image.Point{}, draw.Src)
}

// line draws a segment width pixels thick, stepping along its longer axis; dash > 0 leaves out every other
// dash pixels.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, width, dash int) {
	steps := max(abs(x1-x0), abs(y1-y0), 1)
	for s := 0; s <= steps; s++ {
		if dash > 0 && s/dash%2 == 1 {
			continue
		}
		x := x0 + (x1-x0)*s/steps
		y := y0 + (y1-y0)*s/steps
		fill(img, x-width/2, y-width/2, x+width-width/2, y+width-width/2, c)
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
