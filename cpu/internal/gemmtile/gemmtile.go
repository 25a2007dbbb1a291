// Package gemmtile holds the float32 matrix-multiply micro-kernel that goaccel's convolutions (and, without
// OpenBLAS or where OpenBLAS runs a 256-bit core on a processor with AVX-512, its matrix products) run on:
// one call computes a tile of 6 rows × 16 (or 8) columns, or 64 (or 32) with AVX-512, of
//
//	C[i][j] (+)= Σ_k A_i[offsets[k]] · B[k·ldb + j]
//
// where each of the six A rows is a base pointer and offsets[k] says where its k-th element is. With
// offsets 0, 1, 2, … and rows lda apart that is a plain matrix product; with the offsets of a convolution's
// window (kernel rows and columns, input channels) and rows at the output positions' corners, it is the
// convolution itself, read straight from the (padded) input, with no im2col matrix in between. The kernel
// keeps the 6×16 tile in twelve AVX2 registers and streams A and B: at 2 fused multiply-adds per cycle it
// needs no packing, since every element of B it loads feeds six rows. With AVX-512 (Wide) the 6×64 tile keeps
// 24 registers of 16 lanes and does twice the multiply-adds per instruction, in the same order per element:
// the wide and narrow tiles give bitwise the same results.
//
// The assembly runs on amd64 processors with AVX2 and FMA (Accelerated); the Go loop of the same sums is the
// reference the tests hold it to, within the rounding of fused multiply-adds.
package gemmtile

import (
	"unsafe"
)

// Rows is the number of rows of a tile.
const Rows = 6

// Tile computes a tile of C: c[i·ldc + j] for i < Rows and j < width (64, 32, 16 or 8; 64 and 32 run in Go
// without AVX-512), as the sum over k < len(offsets) of rows[i][offsets[k]] · b[k·ldb + j], added to what c
// holds when accumulate is set, else written over it.
//
// The caller guarantees that every rows[i][offsets[k]] and b[k·ldb + j] lies inside the memory the pointers
// and slices refer to: the kernel does not check.
func Tile(c []float32, ldc int, rows *[Rows]*float32, offsets []int32, b []float32, ldb, width int, accumulate bool) {
	if len(offsets) > 0 {
		_ = b[(len(offsets)-1)*ldb+width-1]
	}
	_ = c[(Rows-1)*ldc+width-1]
	acc := 0
	if accumulate {
		acc = 1
	}
	var offs *int32
	if len(offsets) > 0 {
		offs = &offsets[0]
	}
	if accelerated {
		switch width {
		case 64:
			if wide {
				tile6x64(&c[0], ldc, rows, offs, len(offsets), unsafe.SliceData(b), ldb, acc)
				return
			}
		case 32:
			if wide {
				tile6x32(&c[0], ldc, rows, offs, len(offsets), unsafe.SliceData(b), ldb, acc)
				return
			}
		case 16:
			tile6x16(&c[0], ldc, rows, offs, len(offsets), unsafe.SliceData(b), ldb, acc)
			return
		case 8:
			tile6x8(&c[0], ldc, rows, offs, len(offsets), unsafe.SliceData(b), ldb, acc)
			return
		}
	}
	tileGo(c, ldc, rows, offsets, b, ldb, width, accumulate)
}

// tileGo is Tile in Go: the reference, and what runs without AVX2 or for other widths. Each product is
// rounded before it is added (float32(…) keeps the compiler from fusing them, as it would for GOAMD64=v3 or
// on arm64), so that the Go loop gives the same bits on every architecture and GOAMD64 level.
func tileGo(c []float32, ldc int, rows *[Rows]*float32, offsets []int32, b []float32, ldb, width int, accumulate bool) {
	for i, row := range rows {
		for j := range width {
			var sum float32
			for k, off := range offsets {
				sum += float32(at(row, off) * b[k*ldb+j])
			}
			if accumulate {
				c[i*ldc+j] += sum
			} else {
				c[i*ldc+j] = sum
			}
		}
	}
}

// Accelerated reports whether the assembly kernel runs on this machine.
func Accelerated() bool { return accelerated }

// Wide reports whether the 512-bit (AVX-512) tiles of 32 and 64 columns run on this machine; without them
// Product computes in tiles of 16 and 8 columns.
func Wide() bool { return wide }

// at is row's element at offset.
func at(row *float32, offset int32) float32 {
	return *(*float32)(unsafe.Add(unsafe.Pointer(row), 4*int(offset)))
}
