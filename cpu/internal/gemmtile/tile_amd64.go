package gemmtile

import "golang.org/x/sys/cpu"

// accelerated is whether the assembly runs: AVX2 and FMA (and the operating system's support for their
// registers, which cpu checks). Tests turn it off to compare with the Go loop.
var accelerated = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// wide is whether the 512-bit tiles run: AVX-512F (cpu also checks that the operating system saves the
// registers). Their sums are the same fused multiply-adds in the same order as the 256-bit tiles', so the
// results are bitwise the same; they only do twice the work per instruction.
var wide = accelerated && cpu.X86.HasAVX512F

// Declared in tile_amd64.s: tileGo's sums for width 16 and 8, k = len(offsets), accumulate 0 or 1.

//go:noescape
func tile6x16(c *float32, ldc int, rows *[Rows]*float32, offsets *int32, k int, b *float32, ldb int, accumulate int)

//go:noescape
func tile6x8(c *float32, ldc int, rows *[Rows]*float32, offsets *int32, k int, b *float32, ldb int, accumulate int)

// Declared in tile512_amd64.s: the same sums over 64 and 32 columns, in AVX-512 registers.

//go:noescape
func tile6x64(c *float32, ldc int, rows *[Rows]*float32, offsets *int32, k int, b *float32, ldb int, accumulate int)

//go:noescape
func tile6x32(c *float32, ldc int, rows *[Rows]*float32, offsets *int32, k int, b *float32, ldb int, accumulate int)
