package blas

import "github.com/goaccel/goaccel/cpu/internal/threads"

// transposeTile is the side of the square tiles a transposing copy walks, so that both the rows read and
// the rows written stay in cache while a tile is copied.
const transposeTile = 32

// transposeInto copies src, of dimensions srcDims, into dst with its axes permuted: dst axis i is src axis
// permutation[i]. It merges axes that stay adjacent in both orders, so a copy that keeps the inner block
// intact (e.g. moving a batch axis) runs as a few long contiguous copies, and walks a real transpose of the
// two innermost axes in tiles.
func transposeInto[T any](dst, src []T, srcDims, permutation []int) {
	srcStrides := make([]int, len(srcDims))
	stride := 1
	for axis := len(srcDims) - 1; axis >= 0; axis-- {
		srcStrides[axis] = stride
		stride *= srcDims[axis]
	}

	// dims[i] and strides[i]: size of dst axis i and the src stride that advances it, after merging.
	dims := make([]int, 0, len(permutation)+1)
	strides := make([]int, 0, len(permutation)+1)
	for _, axis := range permutation {
		if srcDims[axis] == 1 {
			continue // Size-1 axes move nothing.
		}
		if last := len(dims) - 1; last >= 0 && strides[last] == srcStrides[axis]*srcDims[axis] {
			dims[last] *= srcDims[axis]
			strides[last] = srcStrides[axis]
			continue
		}
		dims = append(dims, srcDims[axis])
		strides = append(strides, srcStrides[axis])
	}
	if len(dims) == 0 {
		copy(dst, src[:1])
		return
	}
	if len(dims) == 1 {
		// A single strided axis only happens as the inner axis of a transpose; give it a unit outer axis.
		dims, strides = append([]int{1}, dims...), append([]int{0}, strides...)
	}

	// Walk the outer axes (all but the last two) with an odometer; each position is one 2D block.
	numOuter := len(dims) - 2
	rows, cols := dims[numOuter], dims[numOuter+1]
	rowStride, colStride := strides[numOuter], strides[numOuter+1]
	blocks := 1
	for _, d := range dims[:numOuter] {
		blocks *= d
	}
	workers := min(threads.Budget(), blocks*rows)
	if len(dst) < parallelTranspose || workers < 2 {
		copyBlocks(dst, src, dims, strides, 0, blocks)
		return
	}
	if blocks >= workers {
		threads.Split(workers, func(w int) { copyBlocks(dst, src, dims, strides, blocks*w/workers, blocks*(w+1)/workers) })
		return
	}
	// Fewer blocks than threads (one large 2D transpose, say): each thread takes rows of every block.
	threads.Split(workers, func(w int) {
		first, end := rows*w/workers, rows*(w+1)/workers
		for b := range blocks {
			srcOffset := 0
			for axis, rest := numOuter-1, b; axis >= 0; axis-- {
				srcOffset += (rest % dims[axis]) * strides[axis]
				rest /= dims[axis]
			}
			block := dst[b*rows*cols : (b+1)*rows*cols]
			copyBlock(block[first*cols:end*cols], src, srcOffset+first*rowStride, end-first, cols, rowStride, colStride)
		}
	})
}

// parallelTranspose is the size from which a transpose is split over the compute threads (threads.Split):
// below it the hand-over costs more than the copy saves.
const parallelTranspose = 1 << 15

// copyBlocks copies the 2D blocks [first, end) of a merged transpose (see transposeInto): dims and strides
// are dst's axes and the src strides that advance them, the last two the blocks' rows and columns.
func copyBlocks[T any](dst, src []T, dims, strides []int, first, end int) {
	numOuter := len(dims) - 2
	rows, cols := dims[numOuter], dims[numOuter+1]
	rowStride, colStride := strides[numOuter], strides[numOuter+1]
	// The odometer's reading at block first.
	counters := make([]int, numOuter)
	srcOffset := 0
	for axis, rest := numOuter-1, first; axis >= 0; axis-- {
		counters[axis] = rest % dims[axis]
		rest /= dims[axis]
		srcOffset += counters[axis] * strides[axis]
	}
	for b := first; b < end; b++ {
		copyBlock(dst[b*rows*cols:(b+1)*rows*cols], src, srcOffset, rows, cols, rowStride, colStride)
		for axis := numOuter - 1; axis >= 0; axis-- {
			counters[axis]++
			srcOffset += strides[axis]
			if counters[axis] < dims[axis] {
				break
			}
			srcOffset -= strides[axis] * dims[axis]
			counters[axis] = 0
		}
	}
}

// copyBlock writes the rows×cols block dst (row-major, contiguous) from src, where element (r, c) is at
// src[srcOffset + r*rowStride + c*colStride].
func copyBlock[T any](dst, src []T, srcOffset, rows, cols, rowStride, colStride int) {
	if colStride == 1 {
		for r := range rows {
			from := srcOffset + r*rowStride
			copy(dst[r*cols:(r+1)*cols], src[from:from+cols])
		}
		return
	}
	for r0 := 0; r0 < rows; r0 += transposeTile {
		r1 := min(r0+transposeTile, rows)
		for c0 := 0; c0 < cols; c0 += transposeTile {
			c1 := min(c0+transposeTile, cols)
			for r := r0; r < r1; r++ {
				row := dst[r*cols+c0 : r*cols+c1]
				from := srcOffset + r*rowStride + c0*colStride
				for c := range row {
					row[c] = src[from]
					from += colStride
				}
			}
		}
	}
}
