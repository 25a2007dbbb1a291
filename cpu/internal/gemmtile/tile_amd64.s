//go:build amd64

#include "textflag.h"

// The tile's six A rows are base pointers in R8..R13; offsets[k] (int32, in elements) is loaded into AX for
// each k, B's row k is at SI (advanced by ldb·4 bytes in DI per k), C at DX. Accumulators: Y0..Y11 (row i:
// Y(2i), Y(2i+1)) for width 16, Y0..Y5 for width 8.

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

// A row of the 16-wide tile: its element at offset AX times B's two vectors (Y12, Y13).
#define ROW16(ptr, bcast, acc0, acc1) \
	VBROADCASTSS (ptr)(AX*4), bcast; \
	VFMADD231PS Y12, bcast, acc0; \
	VFMADD231PS Y13, bcast, acc1

// A row of the 8-wide tile: its element at offset AX times B's vector (Y12).
#define ROW8(ptr, bcast, acc) \
	VBROADCASTSS (ptr)(AX*4), bcast; \
	VFMADD231PS Y12, bcast, acc

// Store (or add into) C's row at DX, then move DX to the next row (R8 = ldc·4).
#define STORE16(acc0, acc1) \
	VMOVUPS acc0, (DX); \
	VMOVUPS acc1, 32(DX); \
	ADDQ R8, DX
#define ADD16(acc0, acc1) \
	VADDPS (DX), acc0, acc0; \
	VADDPS 32(DX), acc1, acc1; \
	STORE16(acc0, acc1)
#define STORE8(acc) \
	VMOVUPS acc, (DX); \
	ADDQ R8, DX
#define ADD8(acc) \
	VADDPS (DX), acc, acc; \
	STORE8(acc)

// func tile6x16(c *float32, ldc int, rows *[6]*float32, offsets *int32, k int, b *float32, ldb int, accumulate int)
TEXT ·tile6x16(SB), NOSPLIT, $0-64
	LOAD_ARGS
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	TESTQ CX, CX
	JZ store16
loop16:
	MOVLQSX (BX), AX
	VMOVUPS (SI), Y12
	VMOVUPS 32(SI), Y13
	ROW16(R8, Y14, Y0, Y1)
	ROW16(R9, Y15, Y2, Y3)
	ROW16(R10, Y14, Y4, Y5)
	ROW16(R11, Y15, Y6, Y7)
	ROW16(R12, Y14, Y8, Y9)
	ROW16(R13, Y15, Y10, Y11)
	ADDQ $4, BX
	ADDQ DI, SI
	DECQ CX
	JNZ loop16
store16:
	MOVQ ldc+8(FP), R8
	SHLQ $2, R8
	MOVQ accumulate+56(FP), AX
	TESTQ AX, AX
	JZ write16
	ADD16(Y0, Y1)
	ADD16(Y2, Y3)
	ADD16(Y4, Y5)
	ADD16(Y6, Y7)
	ADD16(Y8, Y9)
	ADD16(Y10, Y11)
	VZEROUPPER
	RET
write16:
	STORE16(Y0, Y1)
	STORE16(Y2, Y3)
	STORE16(Y4, Y5)
	STORE16(Y6, Y7)
	STORE16(Y8, Y9)
	STORE16(Y10, Y11)
	VZEROUPPER
	RET

// func tile6x8(c *float32, ldc int, rows *[6]*float32, offsets *int32, k int, b *float32, ldb int, accumulate int)
TEXT ·tile6x8(SB), NOSPLIT, $0-64
	LOAD_ARGS
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	TESTQ CX, CX
	JZ store8
loop8:
	MOVLQSX (BX), AX
	VMOVUPS (SI), Y12
	ROW8(R8, Y14, Y0)
	ROW8(R9, Y15, Y1)
	ROW8(R10, Y14, Y2)
	ROW8(R11, Y15, Y3)
	ROW8(R12, Y14, Y4)
	ROW8(R13, Y15, Y5)
	ADDQ $4, BX
	ADDQ DI, SI
	DECQ CX
	JNZ loop8
store8:
	MOVQ ldc+8(FP), R8
	SHLQ $2, R8
	MOVQ accumulate+56(FP), AX
	TESTQ AX, AX
	JZ write8
	ADD8(Y0)
	ADD8(Y1)
	ADD8(Y2)
	ADD8(Y3)
	ADD8(Y4)
	ADD8(Y5)
	VZEROUPPER
	RET
write8:
	STORE8(Y0)
	STORE8(Y1)
	STORE8(Y2)
	STORE8(Y3)
	STORE8(Y4)
	STORE8(Y5)
	VZEROUPPER
	RET
