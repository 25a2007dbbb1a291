// Package lossplot draws training curves (loss against step) to PNG files
// with gonum.org/v1/plot.
//
// Files are written atomically: the image is rendered into a temporary file
// in the destination's directory, synced, and renamed over the destination,
// so a crash mid-write never leaves a truncated PNG behind and a viewer that
// reloads the file always sees a complete image.
package lossplot

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Size of the PNG images written by [WritePNG]: 768×480 pixels at gonum's
// default 96 dots per inch.
const (
	Width  = 8 * vg.Inch
	Height = 5 * vg.Inch
)

// Series is one curve: Y[i] plotted at X[i] (for a loss curve, the loss at
// training step X[i]).
type Series struct {
	Name string
	X, Y []float64
}

// Smooth returns s smoothed with an exponential moving average, debiased as
// TensorBoard's smoothing slider does so the start of the curve is not pulled
// towards zero: weight 0 leaves the curve as it is, weights towards 1 smooth
// more (0.6 to 0.9 suit noisy per-step losses). weight is clamped to
// [0, 0.999]. Non-finite Y values (a NaN loss) are kept as they are and do
// not enter the average. The result is named "NAME (smoothed)".
func Smooth(s Series, weight float64) Series {
	weight = min(max(weight, 0), 0.999)
	out := Series{
		Name: s.Name + " (smoothed)",
		X:    append([]float64(nil), s.X...),
		Y:    make([]float64, len(s.Y)),
	}
	avg, correction := 0.0, 1.0
	for i, y := range s.Y {
		if !finite(y) {
			out.Y[i] = y
			continue
		}
		avg = weight*avg + (1-weight)*y
		correction *= weight
		out.Y[i] = avg / (1 - correction)
	}
	return out
}

// WritePNG draws the series on one chart titled title, with the step on the
// X axis and the loss on the Y axis, and writes it to path as a PNG image of
// [Width]×[Height], with a legend naming each series. The directory of path
// must exist. With several series the first is taken for the raw, noisy
// curve and drawn thinner and lighter behind the others, so the usual call is
//
//	lossplot.WritePNG(path, title, loss, lossplot.Smooth(loss, 0.9))
//
// Points whose X or Y is NaN or infinite (a diverged loss) are left out of
// the chart; a series left with no point is an error, as are no series at
// all, an empty series, and a series whose X and Y differ in length.
func WritePNG(path, title string, series ...Series) error {
	p, err := newPlot(title, series)
	if err != nil {
		return fmt.Errorf("lossplot: %s: %w", path, err)
	}
	wt, err := p.WriterTo(Width, Height, "png")
	if err != nil {
		return fmt.Errorf("lossplot: %s: rendering: %w", path, err)
	}
	if err := writeAtomic(path, func(f *os.File) error {
		_, err := wt.WriteTo(f)
		return err
	}); err != nil {
		return fmt.Errorf("lossplot: %s: %w", path, err)
	}
	return nil
}

// ErrNoData is wrapped by the errors [WritePNG] returns when there is
// nothing to draw: no series, or a series without (finite) points.
var ErrNoData = errors.New("no data to plot")

func newPlot(title string, series []Series) (*plot.Plot, error) {
	if len(series) == 0 {
		return nil, fmt.Errorf("%w: no series given", ErrNoData)
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "step"
	p.Y.Label.Text = "loss"
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	for i, s := range series {
		name := s.Name
		if name == "" {
			name = fmt.Sprintf("series %d", i)
		}
		if len(s.X) != len(s.Y) {
			return nil, fmt.Errorf("series %q has %d X values but %d Y values", name, len(s.X), len(s.Y))
		}
		if len(s.X) == 0 {
			return nil, fmt.Errorf("%w: series %q is empty", ErrNoData, name)
		}
		pts := make(plotter.XYs, 0, len(s.X))
		for j := range s.X {
			if finite(s.X[j]) && finite(s.Y[j]) {
				pts = append(pts, plotter.XY{X: s.X[j], Y: s.Y[j]})
			}
		}
		if len(pts) == 0 {
			return nil, fmt.Errorf("%w: series %q has no finite point (all %d are NaN or infinite)", ErrNoData, name, len(s.X))
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("series %q: %w", name, err)
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		if len(series) > 1 && i == 0 {
			// With a smoothed curve on top, the raw one is the noisy
			// background: draw it thinner and lighter.
			line.Width = vg.Points(1)
			line.Color = lighten(line.Color)
		}
		p.Add(line)
		p.Legend.Add(name, line)
	}
	return p, nil
}

// writeAtomic writes a file through a temporary file in the same directory
// and renames it over path once it is complete and synced.
func writeAtomic(path string, write func(*os.File) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = write(f); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func lighten(c color.Color) color.Color {
	r, g, b, _ := c.RGBA()
	mix := func(v uint32) uint8 { return uint8((v>>8 + 2*255) / 3) }
	return color.RGBA{R: mix(r), G: mix(g), B: mix(b), A: 255}
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
