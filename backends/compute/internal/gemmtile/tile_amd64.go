package gemmtile

import "golang.org/x/sys/cpu"

// accelerated is whether the assembly runs: AVX2 and FMA (and the operating system's support for their
// registers, which cpu checks). Tests turn it off to compare with the Go loop.
var accelerated = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// Declared in tile_amd64.s: tileGo's sums for width 16 and 8, k = len(offsets), accumulate 0 or 1.

//go:noescape
func tile6x16(c *float32, ldc int, rows *[Rows]*float32, offsets *int32, k int, b *float32, ldb int, accumulate int)

//go:noescape
func tile6x8(c *float32, ldc int, rows *[Rows]*float32, offsets *int32, k int, b *float32, ldb int, accumulate int)
