//go:build blas

package blas

import (
	"strings"
	"testing"

	"github.com/goaccel/goaccel/cpu/internal/gemmtile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// float32Kernels runs test once per kernel float32 products can take in this build: OpenBLAS, and the 512-bit
// tiles where this processor has them.
func float32Kernels(t *testing.T, test func(t *testing.T)) {
	saved := float32OnTiles
	t.Cleanup(func() { float32OnTiles = saved })
	kernels := []bool{false}
	if gemmtile.Wide() {
		kernels = append(kernels, true)
	}
	for _, onTiles := range kernels {
		name := "openblas"
		if onTiles {
			name = "tiles"
		}
		t.Run(name, func(t *testing.T) {
			float32OnTiles = onTiles
			test(t)
		})
	}
}

// TestPathNamesTheFloat32Kernel: the description bin/accel env prints says where float32 products run.
func TestPathNamesTheFloat32Kernel(t *testing.T) {
	require.NoError(t, Install(1))
	t.Cleanup(Uninstall)
	t.Logf("kernel: %s", Path())
	assert.Equal(t, float32OnTiles, strings.Contains(Path(), "float32 on the AVX-512 micro-kernel"))
	assert.Equal(t, gemmtile.Wide() && !avx512Core(openblasCore()), float32OnTiles)
}

// forceFloat32Tiles sets where float32 products run (tiles or OpenBLAS) until the returned func restores it.
func forceFloat32Tiles(onTiles bool) (restore func()) {
	saved := float32OnTiles
	float32OnTiles = onTiles
	return func() { float32OnTiles = saved }
}

func TestAVX512CoreNames(t *testing.T) {
	for name, want := range map[string]bool{"Haswell": false, "Zen": false, "SkylakeX": true, "COOPERLAKE": true,
		"SapphireRapids": true, "Prescott": false} {
		assert.Equal(t, want, avx512Core(name), name)
	}
}
