//go:build amd64

#include "textflag.h"

// The AVX-512 tiles: the same sums as tile6x16, over 32 or 64 columns, for processors whose FMA units are
// 512 bits wide. Registers as in tile_amd64.s: A's six row pointers in R8..R13, offsets at BX, k in CX, B's
// row at SI (DI = ldb·4), C at DX. Accumulators Z0..Z23 (row i: Z(4i)..Z(4i+3)) for width 64, Z0..Z11 (row
// i: Z(2i), Z(2i+1)) for width 32; B's vectors in Z24..Z27; broadcasts alternate between Z28 and Z29.

#define LOAD_ARGS \
	MOVQ rows+16(FP), AX; \
	MOVQ 0(AX), R8; \
	MOVQ 8(AX), R9; \
	MOVQ 16(AX), R10; \
	MOVQ 24(AX), R11; \
	MOVQ 32(AX), R12; \
	MOVQ 40(AX), R13; \
	MOVQ offsets+24(FP), BX; \
	MOVQ k+32(FP), CX; \
	MOVQ b+40(FP), SI; \
	MOVQ ldb+48(FP), DI; \
	SHLQ $2, DI; \
	MOVQ c+0(FP), DX

#define ROW64(ptr, bcast, a0, a1, a2, a3) \
	VBROADCASTSS (ptr)(AX*4), bcast; \
	VFMADD231PS Z24, bcast, a0; \
	VFMADD231PS Z25, bcast, a1; \
	VFMADD231PS Z26, bcast, a2; \
	VFMADD231PS Z27, bcast, a3

#define ROW32(ptr, bcast, a0, a1) \
	VBROADCASTSS (ptr)(AX*4), bcast; \
	VFMADD231PS Z24, bcast, a0; \
	VFMADD231PS Z25, bcast, a1

#define STORE64(a0, a1, a2, a3) \
	VMOVUPS a0, (DX); \
	VMOVUPS a1, 64(DX); \
	VMOVUPS a2, 128(DX); \
	VMOVUPS a3, 192(DX); \
	ADDQ R8, DX
#define ADD64(a0, a1, a2, a3) \
	VADDPS (DX), a0, a0; \
	VADDPS 64(DX), a1, a1; \
	VADDPS 128(DX), a2, a2; \
	VADDPS 192(DX), a3, a3; \
	STORE64(a0, a1, a2, a3)
#define STORE32(a0, a1) \
	VMOVUPS a0, (DX); \
	VMOVUPS a1, 64(DX); \
	ADDQ R8, DX
#define ADD32(a0, a1) \
	VADDPS (DX), a0, a0; \
	VADDPS 64(DX), a1, a1; \
	STORE32(a0, a1)

// func tile6x64(c *float32, ldc int, rows *[6]*float32, offsets *int32, k int, b *float32, ldb int, accumulate int)
TEXT ·tile6x64(SB), NOSPLIT, $0-64
	LOAD_ARGS
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	VPXORD Z16, Z16, Z16
	VPXORD Z17, Z17, Z17
	VPXORD Z18, Z18, Z18
	VPXORD Z19, Z19, Z19
	VPXORD Z20, Z20, Z20
	VPXORD Z21, Z21, Z21
	VPXORD Z22, Z22, Z22
	VPXORD Z23, Z23, Z23
	TESTQ CX, CX
	JZ store64
loop64:
	MOVLQSX (BX), AX
	VMOVUPS (SI), Z24
	VMOVUPS 64(SI), Z25
	VMOVUPS 128(SI), Z26
	VMOVUPS 192(SI), Z27
	ROW64(R8, Z28, Z0, Z1, Z2, Z3)
	ROW64(R9, Z29, Z4, Z5, Z6, Z7)
	ROW64(R10, Z28, Z8, Z9, Z10, Z11)
	ROW64(R11, Z29, Z12, Z13, Z14, Z15)
	ROW64(R12, Z28, Z16, Z17, Z18, Z19)
	ROW64(R13, Z29, Z20, Z21, Z22, Z23)
	ADDQ $4, BX
	ADDQ DI, SI
	DECQ CX
	JNZ loop64
store64:
	MOVQ ldc+8(FP), R8
	SHLQ $2, R8
	MOVQ accumulate+56(FP), AX
	TESTQ AX, AX
	JZ write64
	ADD64(Z0, Z1, Z2, Z3)
	ADD64(Z4, Z5, Z6, Z7)
	ADD64(Z8, Z9, Z10, Z11)
	ADD64(Z12, Z13, Z14, Z15)
	ADD64(Z16, Z17, Z18, Z19)
	ADD64(Z20, Z21, Z22, Z23)
	VZEROUPPER
	RET
write64:
	STORE64(Z0, Z1, Z2, Z3)
	STORE64(Z4, Z5, Z6, Z7)
	STORE64(Z8, Z9, Z10, Z11)
	STORE64(Z12, Z13, Z14, Z15)
	STORE64(Z16, Z17, Z18, Z19)
	STORE64(Z20, Z21, Z22, Z23)
	VZEROUPPER
	RET

// func tile6x32(c *float32, ldc int, rows *[6]*float32, offsets *int32, k int, b *float32, ldb int, accumulate int)
TEXT ·tile6x32(SB), NOSPLIT, $0-64
	LOAD_ARGS
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	TESTQ CX, CX
	JZ store32
loop32:
	MOVLQSX (BX), AX
	VMOVUPS (SI), Z24
	VMOVUPS 64(SI), Z25
	ROW32(R8, Z28, Z0, Z1)
	ROW32(R9, Z29, Z2, Z3)
	ROW32(R10, Z28, Z4, Z5)
	ROW32(R11, Z29, Z6, Z7)
	ROW32(R12, Z28, Z8, Z9)
	ROW32(R13, Z29, Z10, Z11)
	ADDQ $4, BX
	ADDQ DI, SI
	DECQ CX
	JNZ loop32
store32:
	MOVQ ldc+8(FP), R8
	SHLQ $2, R8
	MOVQ accumulate+56(FP), AX
	TESTQ AX, AX
	JZ write32
	ADD32(Z0, Z1)
	ADD32(Z2, Z3)
	ADD32(Z4, Z5)
	ADD32(Z6, Z7)
	ADD32(Z8, Z9)
	ADD32(Z10, Z11)
	VZEROUPPER
	RET
write32:
	STORE32(Z0, Z1)
	STORE32(Z2, Z3)
	STORE32(Z4, Z5)
	STORE32(Z6, Z7)
	STORE32(Z8, Z9)
	STORE32(Z10, Z11)
	VZEROUPPER
	RET
