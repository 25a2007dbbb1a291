package gemmtile

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// setup returns a tile's operands: six rows of a strided matrix read through shuffled offsets (as a
// convolution's window reads its input), B with a row stride wider than the tile, and C with a leading
// dimension wider than the tile.
func setup(rng *rand.Rand, k, width int) (a []float32, rows *[Rows]*float32, offsets []int32, b, c []float32, ldb, ldc int) {
	const lda = 37
	span := k + 5
	a = make([]float32, (Rows-1)*lda+span)
	for i := range a {
		a[i] = rng.Float32()*2 - 1
	}
	rows = new([Rows]*float32)
	for i := range rows {
		rows[i] = &a[i*lda]
	}
	offsets = make([]int32, k)
	for i, j := range rng.Perm(span)[:k] {
		offsets[i] = int32(j)
	}
	ldb, ldc = width+3, width+5
	b = make([]float32, k*ldb)
	for i := range b {
		b[i] = rng.Float32()*2 - 1
	}
	c = make([]float32, Rows*ldc)
	for i := range c {
		c[i] = rng.Float32()
	}
	return a, rows, offsets, b, c, ldb, ldc
}

// TestTileMatchesGo holds the assembly to the Go loop for every width and accumulate mode, on lengths that
// cover an empty sum and long ones; fused multiply-adds round once per term where the Go loop rounds twice,
// so the difference is bounded by the sum of the terms' magnitudes times a few float32 epsilons.
func TestTileMatchesGo(t *testing.T) {
	if !accelerated {
		t.Skip("no AVX2 and FMA on this machine: there is no assembly to compare")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, width := range []int{64, 32, 16, 8} {
		for _, k := range []int{0, 1, 2, 7, 144, 1000} {
			for _, accumulate := range []bool{false, true} {
				name := fmt.Sprintf("width %d, k %d, accumulate %v", width, k, accumulate)
				_, rows, offsets, b, c, ldb, ldc := setup(rng, k, width)
				want := append([]float32(nil), c...)
				tileGo(want, ldc, rows, offsets, b, ldb, width, accumulate)
				got := append([]float32(nil), c...)
				Tile(got, ldc, rows, offsets, b, ldb, width, accumulate)
				for i := range Rows {
					for j := range ldc {
						w, g := want[i*ldc+j], got[i*ldc+j]
						if j >= width {
							require.Equal(t, c[i*ldc+j], g, "%s: c[%d][%d] is outside the tile and must not change", name, i, j)
							continue
						}
						bound := 1e-6 * float64(k+1)
						require.InDelta(t, w, g, bound, "%s: c[%d][%d]", name, i, j)
					}
				}
			}
		}
	}
}

// TestTileGoIsTheSum checks the reference itself against float64 sums.
func TestTileGoIsTheSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	_, rows, offsets, b, c, ldb, ldc := setup(rng, 50, 16)
	tileGo(c, ldc, rows, offsets, b, ldb, 16, false)
	for i, row := range rows {
		for j := range 16 {
			var want float64
			for k, off := range offsets {
				want += float64(at(row, off)) * float64(b[k*ldb+j])
			}
			require.InDelta(t, want, float64(c[i*ldc+j]), 1e-5, "c[%d][%d]", i, j)
		}
	}
}

// BenchmarkTile times a convolution-shaped product: 12544 rows (6 at a time) × 32 columns × 144 terms.
func BenchmarkTile(b *testing.B) {
	const m, n, k = 12540, 32, 144
	rng := rand.New(rand.NewPCG(5, 6))
	a, bm, c := make([]float32, m*k), make([]float32, k*n), make([]float32, m*n)
	for i := range a {
		a[i] = rng.Float32()
	}
	for i := range bm {
		bm[i] = rng.Float32()
	}
	offsets := make([]int32, k)
	for i := range offsets {
		offsets[i] = int32(i)
	}
	var rows [Rows]*float32
	b.SetBytes(0)
	for b.Loop() {
		for i0 := 0; i0 < m; i0 += Rows {
			for i := range rows {
				rows[i] = &a[(i0+i)*k]
			}
			for j0 := 0; j0 < n; j0 += 16 {
				Tile(c[i0*n+j0:], n, &rows, offsets, bm[j0:], n, 16, false)
			}
		}
	}
	b.ReportMetric(2*m*n*k*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
