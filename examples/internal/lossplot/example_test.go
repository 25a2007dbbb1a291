package lossplot_test

import (
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"

	"github.com/goaccel/goaccel/examples/internal/lossplot"
)

// Plotting a noisy loss curve with its smoothed version on top.
func ExampleWritePNG() {
	dir, _ := os.MkdirTemp("", "lossplot")
	defer os.RemoveAll(dir)

	loss := lossplot.Series{Name: "train loss"}
	for step := range 300 {
		loss.X = append(loss.X, float64(step))
		loss.Y = append(loss.Y, 2.3*math.Exp(-float64(step)/60)+0.25+0.1*math.Sin(float64(step)))
	}
	path := filepath.Join(dir, "loss.png")
	if err := lossplot.WritePNG(path, "Fashion-MNIST", loss, lossplot.Smooth(loss, 0.9)); err != nil {
		fmt.Println(err)
		return
	}

	f, _ := os.Open(path)
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	fmt.Println(cfg.Width, cfg.Height, err)

	// An inconsistent series is refused, and the file is left as it was.
	err = lossplot.WritePNG(path, "broken", lossplot.Series{Name: "loss", X: []float64{0, 1}, Y: []float64{1}})
	fmt.Println(err != nil)
	// Output:
	// 768 480 <nil>
	// true
}
