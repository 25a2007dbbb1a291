package lossplot_test

import (
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/examples/internal/lossplot"
)

// noisyLoss is a decaying loss with deterministic noise.
func noisyLoss(n int) lossplot.Series {
	s := lossplot.Series{Name: "loss", X: make([]float64, n), Y: make([]float64, n)}
	for i := range n {
		s.X[i] = float64(i)
		s.Y[i] = 2.3*math.Exp(-float64(i)/40) + 0.3 + 0.15*math.Sin(float64(i)*1.7)
	}
	return s
}

func decode(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	return img
}

func distinctColors(img image.Image) int {
	seen := map[[4]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			seen[[4]uint32{r, g, bl, a}] = true
		}
	}
	return len(seen)
}

func TestWritePNG(t *testing.T) {
	raw := noisyLoss(200)
	withNaN := noisyLoss(50)
	withNaN.Y[10] = math.NaN()
	withNaN.Y[20] = math.Inf(1)
	tests := []struct {
		name   string
		series []lossplot.Series
	}{
		{"one series", []lossplot.Series{raw}},
		{"raw and smoothed", []lossplot.Series{raw, lossplot.Smooth(raw, 0.9)}},
		{"single point", []lossplot.Series{{Name: "loss", X: []float64{1}, Y: []float64{0.5}}}},
		{"non-finite points skipped", []lossplot.Series{withNaN}},
		{"unnamed series", []lossplot.Series{{X: []float64{0, 1, 2}, Y: []float64{3, 2, 1}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "loss.png")
			require.NoError(t, lossplot.WritePNG(path, "training loss", tc.series...))

			img := decode(t, path)
			b := img.Bounds()
			assert.Greater(t, b.Dx(), 0)
			assert.Greater(t, b.Dy(), 0)
			assert.Equal(t, 768, b.Dx())
			assert.Equal(t, 480, b.Dy())
			assert.Greater(t, distinctColors(img), 2, "the image is not a flat colour")

			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Len(t, entries, 1, "no temporary file is left behind")
			assert.Equal(t, "loss.png", entries[0].Name())
			fi, err := entries[0].Info()
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o644), fi.Mode().Perm())
		})
	}
}

func TestWritePNGOverwrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "loss.png")
	require.NoError(t, os.WriteFile(path, []byte("old"), 0o644))
	require.NoError(t, lossplot.WritePNG(path, "loss", noisyLoss(10)))
	decode(t, path)
}

func TestWritePNGErrors(t *testing.T) {
	tests := []struct {
		name     string
		path     func(dir string) string
		series   []lossplot.Series
		contains []string
		noData   bool
	}{
		{
			name:     "no series",
			series:   nil,
			contains: []string{"no series given"},
			noData:   true,
		},
		{
			name:     "empty series",
			series:   []lossplot.Series{noisyLoss(5), {Name: "val"}},
			contains: []string{`series "val" is empty`},
			noData:   true,
		},
		{
			name:     "mismatched lengths",
			series:   []lossplot.Series{{Name: "loss", X: []float64{0, 1, 2}, Y: []float64{1, 2}}},
			contains: []string{`series "loss" has 3 X values but 2 Y values`},
		},
		{
			name:     "mismatched lengths, unnamed",
			series:   []lossplot.Series{noisyLoss(3), {X: []float64{0}, Y: nil}},
			contains: []string{`series "series 1" has 1 X values but 0 Y values`},
		},
		{
			name:     "all points NaN",
			series:   []lossplot.Series{{Name: "loss", X: []float64{0, 1}, Y: []float64{math.NaN(), math.NaN()}}},
			contains: []string{`series "loss" has no finite point`},
			noData:   true,
		},
		{
			name:     "missing directory",
			path:     func(dir string) string { return filepath.Join(dir, "no-such-dir", "loss.png") },
			series:   []lossplot.Series{noisyLoss(5)},
			contains: []string{"no-such-dir", "no such file or directory"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "loss.png")
			if tc.path != nil {
				path = tc.path(dir)
			}
			// A previous, good plot must survive a failed write.
			require.NoError(t, os.WriteFile(filepath.Join(dir, "loss.png"), []byte("previous"), 0o644))

			err := lossplot.WritePNG(path, "loss", tc.series...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "lossplot: "+path+": ")
			for _, s := range tc.contains {
				assert.Contains(t, err.Error(), s)
			}
			if tc.noData {
				assert.ErrorIs(t, err, lossplot.ErrNoData)
			}

			got, err := os.ReadFile(filepath.Join(dir, "loss.png"))
			require.NoError(t, err)
			assert.Equal(t, "previous", string(got))
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			assert.Len(t, entries, 1, "no temporary file is left behind")
		})
	}
}

func TestSmooth(t *testing.T) {
	tests := []struct {
		name   string
		y      []float64
		weight float64
		want   []float64
	}{
		{"weight 0 is identity", []float64{3, 1, 2}, 0, []float64{3, 1, 2}},
		{"constant stays constant (debiased)", []float64{2, 2, 2, 2}, 0.9, []float64{2, 2, 2, 2}},
		{"first value kept", []float64{5, 0}, 0.5, []float64{5, 5.0 * 0.25 / 0.75}},
		{"NaN passed through, not averaged", []float64{1, math.NaN(), 1}, 0.6, []float64{1, math.NaN(), 1}},
		{"weight clamped below", []float64{3, 1}, -2, []float64{3, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := make([]float64, len(tc.y))
			for i := range x {
				x[i] = float64(i)
			}
			s := lossplot.Smooth(lossplot.Series{Name: "loss", X: x, Y: tc.y}, tc.weight)
			assert.Equal(t, "loss (smoothed)", s.Name)
			assert.Equal(t, x, s.X)
			require.Len(t, s.Y, len(tc.want))
			for i := range tc.want {
				if math.IsNaN(tc.want[i]) {
					assert.True(t, math.IsNaN(s.Y[i]))
					continue
				}
				assert.InDelta(t, tc.want[i], s.Y[i], 1e-12, "Y[%d]", i)
			}
		})
	}

	// Smoothing reduces the noise: the smoothed curve varies less from step
	// to step than the raw one.
	raw := noisyLoss(200)
	sm := lossplot.Smooth(raw, 0.9)
	assert.Less(t, totalVariation(sm.Y), totalVariation(raw.Y)/3)
}

func totalVariation(y []float64) float64 {
	tv := 0.0
	for i := 1; i < len(y); i++ {
		tv += math.Abs(y[i] - y[i-1])
	}
	return tv
}
