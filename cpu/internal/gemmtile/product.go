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
}

// ParallelFlops is the work below which a product runs on one thread: handing part of it to an awake
// worker (threads.Split, a microsecond or two) costs more than it saves (as for OpenBLAS, see package blas).
const ParallelFlops = 4 << 20

// Run computes the product, its row tiles split among up to threads goroutines when it is large. Each tile
// is computed by one goroutine, always in the same order, so the result does not depend on threads. It
// panics when an element it would read lies outside A, B or C: the kernel itself does not check.
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
	if workers <= 1 {
		p.tiles(0, tiles)
		return
	}
	threads.Split(workers, func(w int) { p.tiles(tiles*w/workers, tiles*(w+1)/workers) })
}

func (p Product) checkBounds() {
	maxRow, maxOffset := 0, int32(0)
	for _, r := range p.RowStarts {
		maxRow = max(maxRow, r)
	}
	for _, o := range p.Offsets {
		maxOffset = max(maxOffset, o)
	}
	lastB := (len(p.Offsets)-1)*p.LDB + p.N - 1
	lastC := (len(p.RowStarts)-1)*p.LDC + p.N - 1
	if last := maxRow + int(maxOffset); last >= len(p.A) || lastB >= len(p.B) ||
		lastC >= len(p.C) || p.LDC < p.N || p.LDB < p.N {
		panic(fmt.Sprintf("gemmtile: product reads A[%d] of %d, B[%d] of %d (ldb %d), writes C[%d] of %d (ldc %d) "+
			"for %d×%d×%d", last, len(p.A), lastB, len(p.B), p.LDB, lastC, len(p.C), p.LDC, len(p.RowStarts), p.N,
			len(p.Offsets)))
	}
}

// tiles computes row tiles [first, end). Full tiles and column blocks write C in place; a short last tile
// of rows (its missing rows read row 0 again, so every address stays valid) and a last block of fewer than
// 8 columns (B's columns copied beside zeros) go through scratch.
func (p Product) tiles(first, end int) {
	var rows [Rows]*float32
	var scratchC []float32
	// The columns past the last whole block of 8, padded with zeros to 8: [k][8].
	whole := p.N / 8 * 8
	var tailB []float32
	if whole < p.N {
		tailB = make([]float32, len(p.Offsets)*8)
		for k := range p.Offsets {
			copy(tailB[k*8:k*8+p.N-whole], p.B[k*p.LDB+whole:k*p.LDB+p.N])
		}
	}
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
		direct := valid == Rows
		for j := 0; j < p.N; {
			width := tileWidth(whole - j)
			b, ldb := p.B[j:], p.LDB
			if j >= whole {
				b, ldb = tailB, 8
			}
			if direct && j < whole {
				Tile(p.C[r0*p.LDC+j:], p.LDC, &rows, p.Offsets, b, ldb, width, false)
			} else {
				if scratchC == nil {
					scratchC = make([]float32, Rows*maxWidth)
				}
				Tile(scratchC, maxWidth, &rows, p.Offsets, b, ldb, width, false)
				cols := min(width, p.N-j)
				for i := range valid {
					copy(p.C[(r0+i)*p.LDC+j:(r0+i)*p.LDC+j+cols], scratchC[i*maxWidth:i*maxWidth+cols])
				}
			}
			j += width
		}
	}
}

// maxWidth is the widest tile there is (the scratch a short tile is computed into).
const maxWidth = 64

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
