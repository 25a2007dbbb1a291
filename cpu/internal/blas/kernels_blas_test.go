//go:build blas

package blas

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/goaccel/goaccel/cpu/internal/gemmtile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// float32Kernels runs test once per way float32 products can be shared between the kernels in this build:
// all on OpenBLAS and, where this processor has AVX-512, all on the 512-bit tiles and the plain products
// with a small B and the weights gradients with a large one on the tiles, the rest on OpenBLAS
// (tilesBeatOpenBLAS).
func float32Kernels(t *testing.T, test func(t *testing.T)) {
	savedAll, savedSmall := float32OnTiles, smallPlainOnTiles
	t.Cleanup(func() { float32OnTiles, smallPlainOnTiles = savedAll, savedSmall })
	type sharing struct {
		name       string
		all, small bool
	}
	kernels := []sharing{{"openblas", false, false}}
	if gemmtile.Wide() {
		kernels = append(kernels, sharing{"tiles", true, true}, sharing{"small plain products on tiles", false, true})
	}
	for _, k := range kernels {
		t.Run(k.name, func(t *testing.T) {
			float32OnTiles, smallPlainOnTiles = k.all, k.small
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
	assert.Equal(t, !float32OnTiles && smallPlainOnTiles, strings.Contains(Path(), "weights gradients with a larger one on the AVX-512"))
	assert.Equal(t, gemmtile.Wide() && !avx512Core(openblasCore()), float32OnTiles)
}

// forceFloat32Tiles sets where every float32 product runs (tiles or OpenBLAS) until the returned func
// restores the sharing.
func forceFloat32Tiles(onTiles bool) (restore func()) {
	savedAll, savedSmall := float32OnTiles, smallPlainOnTiles
	float32OnTiles, smallPlainOnTiles = onTiles, onTiles
	return func() { float32OnTiles, smallPlainOnTiles = savedAll, savedSmall }
}

// TestSmallPlainProductsOnTiles: where the processor has AVX-512, one product of at least 64 rows whose B
// holds at most 128k elements runs on the tiles, or with B transposed one of at least 1024 rows whose B has
// at most 128 columns and 64k elements, or with A transposed one whose B is over 128k elements (summed in
// runs); smaller weights gradients, batches, short products and larger B stay on OpenBLAS.
func TestSmallPlainProductsOnTiles(t *testing.T) {
	defer forceFloat32Tiles(false)()
	smallPlainOnTiles = true
	for _, tc := range []struct {
		name string
		g    gemmShape
		want bool
	}{
		{"transformer projection", gemmShape{batch: 1, m: 2048, n: 128, k: 128}, true},
		{"feed-forward, B of 128k", gemmShape{batch: 1, m: 2048, n: 512, k: 256}, true},
		{"B over 128k", gemmShape{batch: 1, m: 256, n: 512, k: 512}, false},
		{"A transposed, B over 128k", gemmShape{batch: 1, m: 128, n: 128, k: 2048, transA: true}, true},
		{"A transposed, B of 128k", gemmShape{batch: 1, m: 512, n: 512, k: 256, transA: true}, false},
		{"A transposed, columns not in blocks of 8", gemmShape{batch: 1, m: 128, n: 130, k: 2048, transA: true}, false},
		{"A and B transposed", gemmShape{batch: 1, m: 128, n: 128, k: 2048, transA: true, transB: true}, false},
		{"B transposed, 128 columns", gemmShape{batch: 1, m: 2048, n: 128, k: 512, transB: true}, true},
		{"B transposed, 512 columns", gemmShape{batch: 1, m: 2048, n: 512, k: 128, transB: true}, false},
		{"B transposed, under 1024 rows", gemmShape{batch: 1, m: 64, n: 128, k: 10, transB: true}, false},
		{"batched", gemmShape{batch: 128, m: 64, n: 64, k: 32}, false},
		{"under 64 rows", gemmShape{batch: 1, m: 32, n: 128, k: 128}, false},
	} {
		assert.Equal(t, tc.want, tilesBeatOpenBLAS(tc.g), tc.name)
	}
	smallPlainOnTiles = false
	assert.False(t, tilesBeatOpenBLAS(gemmShape{batch: 1, m: 2048, n: 128, k: 128}), "without AVX-512")
}

func TestAVX512CoreNames(t *testing.T) {
	for name, want := range map[string]bool{"Haswell": false, "Zen": false, "SkylakeX": true, "COOPERLAKE": true,
		"SapphireRapids": true, "Prescott": false} {
		assert.Equal(t, want, avx512Core(name), name)
	}
}

// TestRowPartsMatchOneCall: a product split over threads by rows of C gives what one call gives within
// rounding, for float32 and float64, transposed and strided operands, batches with offsets, and more
// threads than rows. Not bit for bit: OpenBLAS picks its kernels by the matrices' sizes (a part has fewer
// rows), as its own threads do when they split a product. With an OpenBLAS that cannot take concurrent
// calls, products run whole, one at a time.
func TestRowPartsMatchOneCall(t *testing.T) {
	savedFlops, savedThreads, savedConcurrent := parallelFlops, kernelThreads(), concurrentCalls
	t.Cleanup(func() { parallelFlops, concurrentCalls = savedFlops, savedConcurrent; setKernelThreads(savedThreads) })
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 40 {
		g := gemmShape{batch: 1 + rng.IntN(3), m: 1 + rng.IntN(70), n: 1 + rng.IntN(40), k: 1 + rng.IntN(50),
			transA: rng.IntN(2) == 0, transB: rng.IntN(2) == 0}
		if rng.IntN(2) == 0 {
			g.ldA, g.ldB = g.lda()+rng.IntN(5), g.ldb()+rng.IntN(5)
		}
		rowsA, rowsB := pick(g.transA, g.k, g.m), pick(g.transB, g.n, g.k)
		sizeA, sizeB := rowsA*g.lda(), rowsB*g.ldb()
		if rng.IntN(2) == 0 { // items in reverse order, as offsets
			for item := range g.batch {
				g.offA = append(g.offA, int64((g.batch-1-item)*sizeA))
				g.offB = append(g.offB, int64((g.batch-1-item)*sizeB))
			}
		}
		a32, b32 := randomFlat[float32](rng, g.batch*sizeA), randomFlat[float32](rng, g.batch*sizeB)
		a64, b64 := randomFlat[float64](rng, g.batch*sizeA), randomFlat[float64](rng, g.batch*sizeB)
		run := func(flops float64, threads int) ([]float32, []float64) {
			parallelFlops = flops
			setKernelThreads(threads)
			c32, c64 := make([]float32, g.batch*g.m*g.n), make([]float64, g.batch*g.m*g.n)
			sgemmBatchedOpenBLAS(g, a32, b32, c32)
			dgemmBatched(g, a64, b64, c64)
			return c32, c64
		}
		one32, one64 := run(math.Inf(1), 1)
		concurrentCalls = i%4 != 3 // every fourth product as with a serial or OpenMP OpenBLAS: one call
		split32, split64 := run(0, 2+i%3)
		concurrentCalls = savedConcurrent
		require.InDeltaSlice(t, float64s(one32), float64s(split32), 1e-5*float64(g.k), "float32, %+v", g)
		require.InDeltaSlice(t, one64, split64, 1e-13*float64(g.k), "float64, %+v", g)
	}
}

func float64s(values []float32) []float64 {
	wide := make([]float64, len(values))
	for i, v := range values {
		wide[i] = float64(v)
	}
	return wide
}

// tilesBesideOpenBLAS reports whether some float32 products run on the tiles and others on OpenBLAS.
func tilesBesideOpenBLAS() bool { return smallPlainOnTiles && !float32OnTiles }
