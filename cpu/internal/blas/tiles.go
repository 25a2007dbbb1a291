package blas

import (
	"math"
	"sync"

	"github.com/goaccel/goaccel/cpu/internal/gemmtile"
	"github.com/goaccel/goaccel/cpu/internal/threads"
)

// tileGemmBatched runs each batch item of g as a gemmtile.Product: A read in place through offsets (its
// rows lda apart and its elements 1 apart, or the other way round when transposed), B in place unless
// transposed (then copied into [k, n] first, the kernel's order).
func tileGemmBatched(g gemmShape, a, b, c []float32) {
	lda, ldb := g.lda(), g.ldb()
	walk := getWalk(g.m, g.k)
	defer walks.Put(walk)
	rowStarts, offsets := walk.rowStarts[:g.m], walk.offsets[:g.k]
	for i := range rowStarts {
		rowStarts[i] = i * pick(g.transA, 1, lda)
	}
	for k := range offsets {
		offsets[k] = int32(k * pick(g.transA, lda, 1))
	}
	// Every item's product reads A through the same tables: checked once, not once per item.
	reach := gemmtile.ReachOf(rowStarts, offsets)
	var transposed []float32
	if g.transB {
		scratch := getScratch(g.k * g.n)
		defer transposedScratch.Put(scratch)
		transposed = (*scratch)[:g.k*g.n]
	}
	for i := range g.batch {
		bi, ldbi := b[g.startB(i):], ldb
		if g.transB {
			transposeRows(transposed, bi, g.n, g.k, ldb)
			bi, ldbi = transposed, g.n
		}
		gemmtile.Product{A: a[g.startA(i):], RowStarts: rowStarts, Offsets: offsets, B: bi, LDB: ldbi,
			N: g.n, C: c[g.startC(i):], LDC: g.ldc(), Reach: &reach}.Run(threads.Budget())
	}
}

// tilesReach reports whether the tiles' int32 offsets reach every element of g's A: a transposed A steps
// lda elements per term (an A of 8 GiB or more would not fit).
func tilesReach(g gemmShape) bool {
	return int64(max(g.k-1, 0))*int64(pick(g.transA, g.lda(), 1)) <= math.MaxInt32
}

// walk holds how a product's tiles walk A: where each row starts and each term's offset. Pooled, so that
// products step after step (a layer's, every step) reuse them rather than leave them to the collector.
type walk struct {
	rowStarts []int
	offsets   []int32
}

var walks sync.Pool // *walk

// getWalk returns a walk from the pool with room for m rows and k terms.
func getWalk(m, k int) *walk {
	w, _ := walks.Get().(*walk)
	if w == nil {
		w = &walk{}
	}
	if cap(w.rowStarts) < m {
		w.rowStarts = make([]int, m)
	}
	if cap(w.offsets) < k {
		w.offsets = make([]int32, k)
	}
	return w
}

// transposeRows copies src, rows rows of cols elements ld apart, into dst as [cols, rows].
func transposeRows(dst, src []float32, rows, cols, ld int) {
	if ld == cols {
		transposeInto(dst, src[:rows*cols], []int{rows, cols}, []int{1, 0})
		return
	}
	for r := range rows {
		for c, v := range src[r*ld : r*ld+cols] {
			dst[c*rows+r] = v
		}
	}
}

// transposedScratch holds the buffers transposed B operands are copied into, so that products of the same
// sizes step after step reuse memory instead of allocating (and the kernel faulting in) a fresh operand.
var transposedScratch sync.Pool

// getScratch returns a buffer of at least n elements from transposedScratch.
func getScratch(n int) *[]float32 {
	if scratch, ok := transposedScratch.Get().(*[]float32); ok && cap(*scratch) >= n {
		return scratch
	}
	scratch := make([]float32, n)
	return &scratch
}
