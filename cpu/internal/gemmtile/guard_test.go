package gemmtile

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// The guard-band tests place C inside a larger buffer whose other elements (the guard bands before and
// after, and the columns between C's rows past the tile or the product) hold a NaN bit pattern that no sum
// of the tests' finite inputs gives, run the tiles and products, and check that the pattern is intact
// everywhere but the elements they compute: a store past a row's last column, a row too many or a vector
// too wide fails them.

// sentinelBits is the float32 outside the elements written: a quiet NaN with a recognisable payload.
const sentinelBits = 0x7fc0dead

// guardElems is the width of each guard band: more than a row of the widest tile.
const guardElems = 80

var sentinel = math.Float32frombits(sentinelBits)

// guardedC is C (rows × cols, rows ldc apart) start elements past the guard band of a buffer of sentinels.
type guardedC struct {
	buf                    []float32
	first, rows, cols, ldc int
}

func newGuardedC(rows, cols, ldc, start int) guardedC {
	size := 0
	if rows > 0 {
		size = (rows-1)*ldc + cols
	}
	g := guardedC{buf: make([]float32, guardElems+start+size+guardElems), first: guardElems + start, rows: rows,
		cols: cols, ldc: ldc}
	for i := range g.buf {
		g.buf[i] = sentinel
	}
	return g
}

// c is C's slice: from its first element to its last, with no capacity past it.
func (g guardedC) c() []float32 {
	end := len(g.buf) - guardElems
	return g.buf[g.first:end:end]
}

// inside reports whether buffer element i is one of C's rows × cols.
func (g guardedC) inside(i int) bool {
	off := i - g.first
	return off >= 0 && off < g.rows*g.ldc && off%g.ldc < g.cols
}

// check fails t when an element outside C's rows × cols no longer holds the sentinel, or one inside still
// does.
func (g guardedC) check(t *testing.T, format string, args ...any) bool {
	t.Helper()
	for i, v := range g.buf {
		written := math.Float32bits(v) != sentinelBits
		if in := g.inside(i); in != written {
			what := "overwritten outside C"
			if in {
				what = "not written"
			}
			off := i - g.first
			t.Errorf("%s: element %d of the buffer (C's offset %d: row %d, column %d of %d×%d, ldc %d) %s",
				fmt.Sprintf(format, args...), i, off, floorDiv(off, g.ldc), off-floorDiv(off, g.ldc)*g.ldc, g.rows,
				g.cols, g.ldc, what)
			return false
		}
	}
	return true
}

func floorDiv(a, b int) int {
	if a < 0 {
		return -((-a + b - 1) / b)
	}
	return a / b
}

// forEachKernel runs fn with the 512-bit tiles (where they run), the 256-bit ones (where they run), and
// the Go loop, restoring the machine's own setting afterwards.
func forEachKernel(fn func(kernel string)) {
	savedAccelerated, savedWide := accelerated, wide
	defer func() { accelerated, wide = savedAccelerated, savedWide }()
	if savedWide {
		fn("avx512")
	}
	if savedAccelerated {
		wide = false
		fn("avx2")
	}
	accelerated, wide = false, false
	fn("go")
}

// guardTerms are the sums' lengths: 0 to 70, and some large odd ones.
func guardTerms() []int {
	var ks []int
	for k := range 71 {
		ks = append(ks, k)
	}
	return append(ks, 129, 1001)
}

// TestGuardBandsTile runs every tile width on every length of sum, with C's rows packed (ldc = width) and
// with gaps between them, at several misalignments, written and accumulated, and checks that exactly the
// tile's 6 × width elements changed.
func TestGuardBandsTile(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for _, width := range []int{64, 32, 16, 8} {
		for _, k := range guardTerms() {
			_, rows, offsets, b, _, ldb, _ := setup(rng, k, width)
			for _, gap := range []int{0, 1, 7} {
				ldc := width + gap
				for _, start := range []int{0, 1, 3, 5} {
					for _, accumulate := range []bool{false, true} {
						forEachKernel(func(kernel string) {
							g := newGuardedC(Rows, width, ldc, start)
							c := g.c()
							if accumulate {
								for i := range Rows {
									for j := range width {
										c[i*ldc+j] = rng.Float32()
									}
								}
							}
							Tile(c, ldc, rows, offsets, b, ldb, width, accumulate)
							g.check(t, "Tile (%s) width %d, k %d, ldc %d, start %d, accumulate %v", kernel, width, k, ldc,
								start, accumulate)
						})
						if t.Failed() {
							return
						}
					}
				}
			}
		}
	}
}

// TestGuardBandsProduct runs products of every column count from 0 to 70 (and some larger odd ones) over
// ragged row counts, with C's rows packed and with gaps, on one thread and split among three, and checks
// that exactly C's rows × N elements changed.
func TestGuardBandsProduct(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	var columns []int
	for n := range 71 {
		columns = append(columns, n)
	}
	columns = append(columns, 129, 201)
	for _, n := range columns {
		for _, m := range []int{1, 5, 6, 7, 13} {
			for _, k := range []int{0, 1, 3, 17} {
				a := make([]float32, m*k+1)
				for i := range a {
					a[i] = rng.Float32()*2 - 1
				}
				ldb := n + 3
				b := make([]float32, k*ldb+1)
				for i := range b {
					b[i] = rng.Float32()*2 - 1
				}
				p := Product{A: a, B: b, LDB: ldb, N: n}
				for i := range m {
					p.RowStarts = append(p.RowStarts, i*k)
				}
				for kk := range k {
					p.Offsets = append(p.Offsets, int32(kk))
				}
				for _, gap := range []int{0, 3} {
					for _, start := range []int{0, 1, 6} {
						for _, threads := range []int{1, 3} {
							forEachKernel(func(kernel string) {
								g := newGuardedC(m, n, n+gap, start)
								p.C, p.LDC = g.c(), n+gap
								p.run(threads, true)
								g.check(t, "Product (%s) %d×%d×%d, ldc %d, start %d, threads %d", kernel, m, n, k, n+gap,
									start, threads)
							})
						}
						if t.Failed() {
							return
						}
					}
				}
			}
		}
	}
}

// TestGuardBandsProductInRuns: products that sum in runs (each tile resuming from C, or from the scratch of
// a short last tile) write their tiles and nothing else.
func TestGuardBandsProductInRuns(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 36))
	for _, size := range [][3]int{{13, 32, 5000}, {7, 64, 2100}, {20, 40, 4000}} {
		m, n, k := size[0], size[1], size[2]
		if !SumsInRuns(m, n, k) {
			t.Fatalf("%d×%d×%d should sum in runs", m, n, k)
		}
		p := randomProduct(rng, m, n, k, false)
		for _, threads := range []int{1, 3} {
			forEachKernel(func(kernel string) {
				g := newGuardedC(m, n, n+3, 6)
				p.C, p.LDC = g.c(), n+3
				p.run(threads, true)
				g.check(t, "Product (%s) %d×%d×%d in runs, threads %d", kernel, m, n, k, threads)
			})
		}
	}
}
