package main

import "fmt"

// File is one generated assembly file: its name and contents.
type File struct {
	Name string
	Text []byte
}

// GenerateTiles returns package gemmtile's two assembly files: tile_amd64.s (the AVX2 tiles of 16 and 8
// columns) and tile512_amd64.s (the AVX-512 tiles of 64, 32 and 16 columns; the last, tile6x16wide, keeps
// a row in one register, for products and convolutions of 16 output channels).
//
// Every tile computes c[i·ldc + j] = Σ_k rows[i][offsets[k]] · b[k·ldb + j] for its six rows (accumulating:
// starting from c's element), one fused multiply-add per term in increasing k, for each lane alike: the wide and narrow tiles give bitwise the
// same results.
func GenerateTiles() []File {
	narrow := &gen{}
	narrow.header()
	narrow.p("")
	narrow.comment(`The tile's six A rows are base pointers in R8..R13; offsets[k] (int32, in elements) is loaded into AX for
each k, B's row k is at SI (advanced by ldb·4 bytes in DI per k), C at DX. Accumulators: Y0..Y11 (row i:
Y(2i), Y(2i+1)) for width 16, Y0..Y5 for width 8; B's vectors in Y12, Y13; broadcasts alternate between
Y14 and Y15. When accumulate is set, the prologue first loads C's tile into the accumulators (AX = ldc·4, BX
walking C's rows).`)
	narrow.tile(ymm, 16)
	narrow.tile(ymm, 8)

	wide := &gen{}
	wide.header()
	wide.p("")
	wide.comment(`The AVX-512 tiles: the same sums as tile6x16, over 32 or 64 columns, for processors whose FMA units are
512 bits wide. Registers as in tile_amd64.s: A's six row pointers in R8..R13, offsets at BX, k in CX, B's
row at SI (DI = ldb·4), C at DX. Accumulators Z0..Z23 (row i: Z(4i)..Z(4i+3)) for width 64, Z0..Z11 (row
i: Z(2i), Z(2i+1)) for width 32, Z0..Z5 for width 16; B's vectors in Z24..Z27; broadcasts alternate between Z28 and Z29.`)
	wide.tile(zmm, 64)
	wide.tile(zmm, 32)
	wide.tile(zmm, 16)

	return []File{{"tile_amd64.s", narrow.buf.Bytes()}, {"tile512_amd64.s", wide.buf.Bytes()}}
}

// comment writes text as a block of // lines.
func (g *gen) comment(text string) {
	start := 0
	for i := 0; i <= len(text); i++ {
		if i == len(text) || text[i] == '\n' {
			g.p("// %s", text[start:i])
			start = i + 1
		}
	}
}

// vectorRegs is a register file the tiles run in: AVX2's 16 YMM or AVX-512's 32 ZMM registers.
type vectorRegs struct {
	prefix string // Y or Z
	bytes  int    // bytes per register: 32 or 64
	// zero is the instruction that clears a register (x, x, x).
	zero string
	// b is the first of the registers that hold B's vectors; bcast the two that the rows' broadcasts
	// alternate between.
	b     int
	bcast [2]int
}

var (
	ymm = vectorRegs{prefix: "Y", bytes: 32, zero: "VXORPS", b: 12, bcast: [2]int{14, 15}}
	zmm = vectorRegs{prefix: "Z", bytes: 64, zero: "VPXORD", b: 24, bcast: [2]int{28, 29}}
)

func (v vectorRegs) r(i int) string { return fmt.Sprintf("%s%d", v.prefix, i) }

// disp is the memory operand off bytes past the address in reg.
func disp(reg string, off int) string {
	if off == 0 {
		return "(" + reg + ")"
	}
	return fmt.Sprintf("%d(%s)", off, reg)
}

// tileRows are the general registers that hold the six A row pointers.
var tileRows = [6]string{"R8", "R9", "R10", "R11", "R12", "R13"}

// tile writes tile6x<width>: the accumulators of row i are v.r(i·per) … v.r(i·per + per − 1), per = width
// / lanes. Each k loads offsets[k] and B's row k once (its per vectors), then for each row broadcasts the row's
// element and adds its products with B's vectors into the row's accumulators, which start from C's rows when
// accumulate is set and from zero otherwise. At the end the accumulators are stored into C's rows.
func (g *gen) tile(v vectorRegs, width int) {
	per := width * 4 / v.bytes
	name := fmt.Sprintf("tile6x%d", width)
	if v.bytes == zmm.bytes && width*4 < 2*v.bytes {
		name += "wide" // tile6x16 is the AVX2 tile's name
	}
	g.p("")
	g.p("// func %s(c *float32, ldc int, rows *[6]*float32, offsets *int32, k int, b *float32, ldb int, accumulate int)", name)
	g.p("TEXT ·%s(SB), NOSPLIT, $0-64", name)
	acc := func(row, j int) string { return v.r(row*per + j) }
	// The accumulators start from C's tile (accumulate) or from zero, so that a sum split into runs of k,
	// each resuming from what the last one stored, gives the bits of the whole sum.
	g.p("\tMOVQ c+0(FP), DX")
	g.p("\tMOVQ accumulate+56(FP), AX")
	g.p("\tTESTQ AX, AX")
	g.p("\tJNZ load%d", width)
	for i := range len(tileRows) * per {
		g.p("\t%s %s, %s, %s", v.zero, v.r(i), v.r(i), v.r(i))
	}
	g.p("\tJMP start%d", width)
	g.p("load%d:", width)
	g.p("\tMOVQ ldc+8(FP), AX")
	g.p("\tSHLQ $2, AX")
	g.p("\tMOVQ DX, BX")
	for row := range tileRows {
		for j := range per {
			g.p("\tVMOVUPS %s, %s", disp("BX", j*v.bytes), acc(row, j))
		}
		if row+1 < len(tileRows) {
			g.p("\tADDQ AX, BX")
		}
	}
	g.p("start%d:", width)
	g.p("\tMOVQ rows+16(FP), AX")
	for i, reg := range tileRows {
		g.p("\tMOVQ %d(AX), %s", 8*i, reg)
	}
	g.p("\tMOVQ offsets+24(FP), BX")
	g.p("\tMOVQ k+32(FP), CX")
	g.p("\tMOVQ b+40(FP), SI")
	g.p("\tMOVQ ldb+48(FP), DI")
	g.p("\tSHLQ $2, DI")
	g.p("\tTESTQ CX, CX")
	g.p("\tJZ store%d", width)
	g.p("loop%d:", width)
	g.p("\tMOVLQSX (BX), AX")
	for j := range per {
		g.p("\tVMOVUPS %s, %s", disp("SI", j*v.bytes), v.r(v.b+j))
	}
	for row, ptr := range tileRows {
		bcast := v.r(v.bcast[row%2])
		g.p("\tVBROADCASTSS (%s)(AX*4), %s", ptr, bcast)
		for j := range per {
			g.p("\tVFMADD231PS %s, %s, %s", v.r(v.b+j), bcast, acc(row, j))
		}
	}
	g.p("\tADDQ $4, BX")
	g.p("\tADDQ DI, SI")
	g.p("\tDECQ CX")
	g.p("\tJNZ loop%d", width)
	g.p("store%d:", width)
	g.p("\tMOVQ ldc+8(FP), R8") // the row pointers are done with: R8 becomes ldc·4
	g.p("\tSHLQ $2, R8")
	for row := range tileRows {
		for j := range per {
			g.p("\tVMOVUPS %s, %s", acc(row, j), disp("DX", j*v.bytes))
		}
		g.p("\tADDQ R8, DX")
	}
	g.p("\tVZEROUPPER")
	g.p("\tRET")
}
