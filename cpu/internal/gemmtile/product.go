package gemmtile

import (
	"fmt"

	"github.com/goaccel/goaccel/cpu/internal/threads"
)

// Product is C[r·LDC + j] = Σ_k A[RowStarts[r] + Offsets[k]] · B[k·LDB + j] for r < len(RowStarts) and
// j < N: a matrix product whose left operand is read through offsets. A plain row-major [m, k] matrix has
// RowStarts i·k and Offsets 0, 1, …, k−1; its transpose (stored [k, m]) RowStarts i and Offsets k·m; a
// convolution's rows are output positions and its offsets walk the kernel window and the input channels.
type Product struct {
	A         []float32
	RowStarts []int
	Offsets   []int32
	B         []float32
	LDB, N    int
	C         []float32
	LDC       int
	// Reach, when set, is ReachOf(RowStarts, Offsets), computed once by a caller that runs the same tables
	// many times (a convolution's, every step): Run checks it against A instead of scanning the tables. It
	// must be at least what ReachOf gives: Run cannot see a Reach that understates the tables.
	Reach *Reach
}

// Reach is the largest row start and the largest offset of a product's tables: the last element of A it
// can read is at their sum.
type Reach struct {
	Row    int
	Offset int32
}

// ReachOf scans a product's tables for their Reach.
func ReachOf(rowStarts []int, offsets []int32) Reach {
	var r Reach
	for _, start := range rowStarts {
		r.Row = max(r.Row, start)
	}
	for _, o := range offsets {
		r.Offset = max(r.Offset, o)
	}
	return r
}

// ParallelFlops is the work below which a product runs on one thread: handing part of it to an awake
// worker (threads.Split, a microsecond or two) costs more than it saves (as for OpenBLAS, see package blas).
const ParallelFlops = 4 << 20

// Run computes the product, its row tiles split among up to threads goroutines when it is large. Each tile
// is computed by one goroutine, always in the same order, so the result does not depend on threads. It
// panics when an element it would read lies outside A (as far as Reach, or the tables scanned, say), B or C:
// the kernel itself does not check.
func (p Product) Run(workers int) { p.run(workers, false) }

// run is Run; split forces the split among the workers whatever the size (for tests).
func (p Product) run(maxWorkers int, split bool) {
	rows := len(p.RowStarts)
	if rows == 0 || p.N == 0 {
		return
	}
	if len(p.Offsets) == 0 { // an empty sum
		for r := range rows {
			clear(p.C[r*p.LDC : r*p.LDC+p.N])
		}
		return
	}
	p.checkBounds()
	tiles := (rows + Rows - 1) / Rows
	workers := min(maxWorkers, tiles)
	if 2*float64(rows)*float64(p.N)*float64(len(p.Offsets)) < ParallelFlops && !split {
		workers = 1
	}
	run := p.kRun()
	if workers <= 1 {
		p.tiles(0, tiles, run)
		return
	}
	threads.Split(workers, func(w int) { p.tiles(tiles*w/workers, tiles*(w+1)/workers, run) })
}

func (p Product) checkBounds() {
	reach := p.Reach
	if reach == nil {
		r := ReachOf(p.RowStarts, p.Offsets)
		reach = &r
	}
	maxRow, maxOffset := reach.Row, reach.Offset
	lastB := (len(p.Offsets)-1)*p.LDB + p.N - 1
	lastC := (len(p.RowStarts)-1)*p.LDC + p.N - 1
	if last := maxRow + int(maxOffset); last >= len(p.A) || lastB >= len(p.B) ||
		lastC >= len(p.C) || p.LDC < p.N || p.LDB < p.N {
		panic(fmt.Sprintf("gemmtile: product reads A[%d] of %d, B[%d] of %d (ldb %d), writes C[%d] of %d (ldc %d) "+
			"for %d×%d×%d", last, len(p.A), lastB, len(p.B), p.LDB, lastC, len(p.C), p.LDC, len(p.RowStarts), p.N,
			len(p.Offsets)))
	}
}

// tiles computes row tiles [first, end), summing in runs of run terms. Full tiles and column blocks write C
// in place; a short last tile of rows (its missing rows read row 0 again, so every address stays valid) and
// a last block of fewer than 8 columns (B's columns copied beside zeros) go through scratch. In runs (kRun;
// one run when there are last columns), every tile sums the first run, then every tile resumes from what it
// stored, so that the part of B all the tiles read stays in cache; each element is still summed in
// increasing k, bitwise as in one run.
func (p Product) tiles(first, end, run int) {
	var rows [Rows]*float32
	k := len(p.Offsets)
	// The columns past the last whole block of 8, padded with zeros to 8: [k][8].
	whole := p.N / 8 * 8
	var tailB []float32
	if whole < p.N {
		tailB = make([]float32, k*8)
		for i := range p.Offsets {
			copy(tailB[i*8:i*8+p.N-whole], p.B[i*p.LDB+whole:i*p.LDB+p.N])
		}
	}
	// scratch holds a tile that is not written in place: in one run, a block of a short last tile or of a
	// full tile's last columns, copied out at once (one block's width); across runs, the whole short last
	// tile (the only one), kept until the last run.
	var scratch []float32
	ldScratch, scratchAtColumn := maxWidth, false
	if run < k {
		ldScratch, scratchAtColumn = p.N, true
	}
	for k0 := 0; k0 < k; k0 += run {
		k1 := min(k, k0+run)
		offsets, resume, last := p.Offsets[k0:k1], k0 > 0, k1 == k
		for t := first; t < end; t++ {
			r0 := t * Rows
			valid := min(Rows, len(p.RowStarts)-r0)
			for i := range Rows {
				start := p.RowStarts[r0]
				if i < valid {
					start = p.RowStarts[r0+i]
				}
				rows[i] = &p.A[start]
			}
			for j := 0; j < p.N; {
				width := tileWidth(whole - j)
				b, ldb := p.B[k0*p.LDB+j:], p.LDB
				if j >= whole {
					b, ldb = tailB[k0*8:], 8
				}
				if valid == Rows && j < whole {
					Tile(p.C[r0*p.LDC+j:], p.LDC, &rows, offsets, b, ldb, width, resume)
				} else {
					if scratch == nil {
						scratch = make([]float32, Rows*ldScratch)
					}
					block := scratch
					if scratchAtColumn {
						block = scratch[j:]
					}
					Tile(block, ldScratch, &rows, offsets, b, ldb, width, resume)
					if last {
						cols := min(width, p.N-j)
						for i := range valid {
							copy(p.C[(r0+i)*p.LDC+j:(r0+i)*p.LDC+j+cols], block[i*ldScratch:i*ldScratch+cols])
						}
					}
				}
				j += width
			}
		}
	}
}

// maxWidth is the widest tile there is: the scratch a block of a short tile is computed into, in one run.
const maxWidth = 64

// A product whose B takes more than splitBytes sums in runs of about runBytes of B, and at least minRun
// terms (kRun). Below splitBytes B stays in a core's L2 (2 MiB on the machines measured) beside the rows
// of A the tiles stream, and runs would only cost: each run of a tile loads and stores its part of C again.
// Above it, the rows of A push B out before the next tile reads it again, and a run of B that stays in
// cache pays: in L1 for a narrow B (a convolution's kernel gradient, 32 columns: 16 KiB), in L2 for a wide
// one (minRun terms of 128 or 512 columns take 64 or 256 KiB). Measured (BenchmarkProduct and BenchmarkKernelGradientCNN, one core, GFLOP/s): the transformer's
// weight gradients 113/87/60 → 151/160/157, the CNN's second kernel gradient 60 → 154, plain products
// unchanged (170–176); runs for every B over 32 KiB, however short, halved the plain [2048,128]×[128,512]
// (171 → 71).
const (
	splitBytes = 512 << 10
	runBytes   = 16 << 10
	minRun     = 128
)

// SumsInRuns reports whether a product of rows × n over k terms sums in runs of k (kRun): when its B takes
// more than splitBytes, more than one row tile reads it, and its columns come in whole blocks of 8.
func SumsInRuns(rows, n, k int) bool {
	return n%8 == 0 && rows > Rows && k*n*4 > splitBytes
}

// kRun is the length of the runs of k that tiles splits the contraction into (SumsInRuns): about runBytes
// of B each and at least minRun terms, the last run the rest; else all of it.
func (p Product) kRun() int {
	k := len(p.Offsets)
	if !SumsInRuns(len(p.RowStarts), p.N, k) {
		return k
	}
	runs := (k*p.N*4 + runBytes - 1) / runBytes
	return max((k+runs-1)/runs, minRun)
}

// tileWidth is the widest tile this machine computes that fits in the columns left of the whole blocks of 8
// (8 when fewer than 16 are left: the last block of 8 may be B's zero-padded tail).
func tileWidth(left int) int {
	switch {
	case wide && left >= 64:
		return 64
	case wide && left >= 32:
		return 32
	case left >= 16:
		return 16
	}
	return 8
}
