package traceevent

import (
	"image"
	"image/color"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDrawText(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 200, 40))
	ink := color.RGBA{200, 0, 0, 255}
	w := DrawText(img, 10, 5, "1 Gbit/s", ink)
	assert.Equal(t, TextWidth("1 Gbit/s"), w)
	assert.Equal(t, 8*advance*scale, w, "eight cells")
	inked := 0
	for y := range 40 {
		for x := range 200 {
			if img.RGBAAt(x, y) == ink {
				inked++
				assert.True(t, x >= 10 && x < 10+w && y >= 5 && y < 5+TextHeight, "ink at (%d, %d) outside the text", x, y)
			}
		}
	}
	assert.Positive(t, inked)
}
