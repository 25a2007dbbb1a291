package gemmtile

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProductMatchesSums runs plain and transposed-A products of ragged sizes (rows not a multiple of 6,
// columns not a multiple of 8, an empty sum), with leading dimensions wider than the operands, on one and
// several threads, against float64 sums; columns of C outside the product must stay as they were.
func TestProductMatchesSums(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, size := range [][3]int{{1, 1, 1}, {7, 3, 5}, {13, 17, 0}, {6, 16, 33}, {50, 40, 70}, {40, 136, 20}, {300, 24, 200}} {
		for _, transA := range []bool{false, true} {
			for _, threads := range []int{1, 3} {
				m, n, k := size[0], size[1], size[2]
				name := fmt.Sprintf("%d×%d×%d transA=%v threads=%d", m, n, k, transA, threads)
				a := make([]float32, m*k+1)
				for i := range a {
					a[i] = rng.Float32()*2 - 1
				}
				ldb, ldc := n+2, n+3
				b := make([]float32, k*ldb+1)
				for i := range b {
					b[i] = rng.Float32()*2 - 1
				}
				c := make([]float32, m*ldc)
				for i := range c {
					c[i] = 99
				}
				p := Product{A: a, B: b, LDB: ldb, N: n, C: c, LDC: ldc}
				elem := func(i, kk int) float32 { return a[i*k+kk] }
				for i := range m {
					p.RowStarts = append(p.RowStarts, i*k)
				}
				for kk := range k {
					p.Offsets = append(p.Offsets, int32(kk))
				}
				if transA { // A stored [k, m]
					elem = func(i, kk int) float32 { return a[kk*m+i] }
					p.RowStarts, p.Offsets = p.RowStarts[:0], p.Offsets[:0]
					for i := range m {
						p.RowStarts = append(p.RowStarts, i)
					}
					for kk := range k {
						p.Offsets = append(p.Offsets, int32(kk*m))
					}
				}
				// Large enough products split among threads; the small ones here force it.
				p.run(threads, true)
				for i := range m {
					for j := range ldc {
						if j >= n {
							require.Equal(t, float32(99), c[i*ldc+j], "%s: C[%d][%d] is outside the product", name, i, j)
							continue
						}
						var want float64
						for kk := range k {
							want += float64(elem(i, kk)) * float64(b[kk*ldb+j])
						}
						require.InDelta(t, want, float64(c[i*ldc+j]), 1e-5*float64(k+1), "%s: C[%d][%d]", name, i, j)
					}
				}
			}
		}
	}
}

// TestWideTilesMatchNarrow: the 512-bit tiles compute the same fused multiply-adds in the same order as the
// 256-bit ones, so a product comes out bitwise the same either way (plain and transposed A, ragged sizes).
func TestWideTilesMatchNarrow(t *testing.T) {
	if !wide {
		t.Skip("no AVX-512 on this machine: there are no 512-bit tiles to compare")
	}
	t.Cleanup(func() { wide = true })
	rng := rand.New(rand.NewPCG(13, 14))
	for _, size := range [][3]int{{6, 64, 5}, {13, 100, 37}, {64, 32, 64}, {130, 200, 129}, {7, 72, 300}, {19, 16, 41}, {12, 48, 9}} {
		for _, transA := range []bool{false, true} {
			m, n, k := size[0], size[1], size[2]
			p := randomProduct(rng, m, n, k, transA)
			results := make([][]float32, 2)
			for i, useWide := range []bool{false, true} {
				wide = useWide
				p.C = make([]float32, m*n)
				p.Run(1)
				results[i] = p.C
			}
			require.Equal(t, results[0], results[1], "%d×%d×%d transA=%v", m, n, k, transA)
		}
	}
}

// TestRunsAreTheWholeSum: a long contraction computed in runs of k (each tile resuming from what it stored)
// gives bitwise what one run gives, on full tiles, a short last tile and every tile width, on one thread and
// split among several; with columns past the last block of 8 there is one run.
func TestRunsAreTheWholeSum(t *testing.T) {
	saved := wide
	t.Cleanup(func() { wide = saved })
	rng := rand.New(rand.NewPCG(15, 16))
	for _, size := range [][3]int{{13, 32, 5000}, {20, 16, 9000}, {9, 64, 2100}, {30, 96, 1500}, {13, 40, 4000}, {14, 20, 7000}} {
		for _, transA := range []bool{false, true} {
			for _, useWide := range []bool{false, true} {
				if useWide && !saved {
					continue
				}
				wide = useWide
				m, n, k := size[0], size[1], size[2]
				name := fmt.Sprintf("%d×%d×%d transA=%v wide=%v", m, n, k, transA, useWide)
				p := randomProduct(rng, m, n, k, transA)
				if n%8 != 0 {
					require.Equal(t, k, p.kRun(), "%s: columns past the last block of 8 take one run", name)
				} else {
					require.Less(t, p.kRun(), k, "%s: B is large enough to be summed in runs", name)
				}
				tiles := (m + Rows - 1) / Rows
				p.C = make([]float32, m*n)
				p.tiles(0, tiles, k)
				whole := p.C
				for _, threads := range []int{1, 3} {
					p.C = make([]float32, m*n)
					p.run(threads, true)
					require.Equal(t, whole, p.C, "%s threads=%d", name, threads)
				}
			}
		}
	}
}

// TestProductRefusesOutOfBounds: a row start past A is a panic, not a stray read, whether Run scans the
// tables or is given their Reach.
func TestProductRefusesOutOfBounds(t *testing.T) {
	rowStarts, offsets := []int{8, 0}, []int32{2, 0, 1}
	reach := ReachOf(rowStarts, offsets)
	require.Equal(t, Reach{Row: 8, Offset: 2}, reach)
	for _, given := range []*Reach{nil, &reach} {
		p := Product{A: make([]float32, 10), RowStarts: rowStarts, Offsets: offsets, B: make([]float32, 3*8),
			LDB: 8, N: 8, C: make([]float32, 16), LDC: 8, Reach: given}
		require.PanicsWithValue(t, "gemmtile: product reads A[10] of 10, B[23] of 24 (ldb 8), writes C[15] of 16 (ldc 8) for 2×8×3",
			func() { p.Run(1) }, "reach given: %v", given != nil)
	}
	// Run checks the Reach it is given, not the tables: one past A is refused even for tables inside it.
	p := Product{A: make([]float32, 11), RowStarts: rowStarts, Offsets: offsets, B: make([]float32, 3*8),
		LDB: 8, N: 8, C: make([]float32, 16), LDC: 8, Reach: &Reach{Row: 9, Offset: 2}}
	require.PanicsWithValue(t, "gemmtile: product reads A[11] of 11, B[23] of 24 (ldb 8), writes C[15] of 16 (ldc 8) for 2×8×3",
		func() { p.Run(1) })
	p.Reach = &reach
	require.NotPanics(t, func() { p.Run(1) })
}

// BenchmarkProduct times the transformer example's products (2048 positions, width 128, MLP 512; the
// weight gradients sum over the 2048 positions with A transposed) with the 512-bit tiles and without.
func BenchmarkProduct(b *testing.B) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, size := range []struct {
		m, n, k int
		transA  bool
	}{{2048, 128, 128, false}, {2048, 512, 128, false}, {2048, 128, 512, false}, {128, 128, 2048, true},
		{512, 128, 2048, true}, {128, 512, 2048, true}, {64, 64, 32, false}, {64, 32, 64, false}} {
		a, bm, c := make([]float32, size.m*size.k), make([]float32, size.k*size.n), make([]float32, size.m*size.n)
		for i := range a {
			a[i] = rng.Float32()
		}
		for i := range bm {
			bm[i] = rng.Float32()
		}
		p := Product{A: a, B: bm, LDB: size.n, N: size.n, C: c, LDC: size.n}
		for i := range size.m {
			p.RowStarts = append(p.RowStarts, pick(size.transA, i, i*size.k))
		}
		for kk := range size.k {
			p.Offsets = append(p.Offsets, int32(pick(size.transA, kk*size.m, kk)))
		}
		for _, useWide := range []bool{false, true} {
			if useWide && !wide {
				continue
			}
			b.Run(fmt.Sprintf("%dx%dx%d transA=%v wide=%v", size.m, size.n, size.k, size.transA, useWide), func(b *testing.B) {
				saved := wide
				wide = useWide
				defer func() { wide = saved }()
				for b.Loop() {
					p.Run(1)
				}
				b.ReportMetric(2*float64(size.m*size.n*size.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// randomProduct is an m×n product over k terms of random A and B in [-1, 1), both packed, A stored [m, k]
// or (transA) [k, m]; C is left to the caller.
func randomProduct(rng *rand.Rand, m, n, k int, transA bool) Product {
	a, b := make([]float32, m*k), make([]float32, k*n)
	for i := range a {
		a[i] = rng.Float32()*2 - 1
	}
	for i := range b {
		b[i] = rng.Float32()*2 - 1
	}
	p := Product{A: a, B: b, LDB: n, N: n, LDC: n}
	for i := range m {
		p.RowStarts = append(p.RowStarts, pick(transA, i, i*k))
	}
	for kk := range k {
		p.Offsets = append(p.Offsets, int32(pick(transA, kk*m, kk)))
	}
	return p
}

func pick(cond bool, yes, no int) int {
	if cond {
		return yes
	}
	return no
}
