//go:build !purego

package vec32

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:generate go run ./asmgen -out vec32_amd64.s

// accelerated is whether the assembly runs: it needs AVX2 (and the operating system's support for its
// registers, which cpu checks). Tests turn it off to run the Go loops on the same inputs.
var accelerated = cpu.X86.HasAVX2

// wide is whether Exp and Erf run on AVX-512's sixteen lanes (expV512, erfV512) where the processor has
// them, over at least wideFrom elements: the same operations per lane as the AVX2 kernels, which they
// outrun by a third (Erf) to a half (Exp) on a fused chain's tiles. On shorter runs (a softmax's rows of
// 64) the switch of register width cost more than it saved. Tests turn it off to check the AVX2 kernels.
var wide = accelerated && cpu.X86.HasAVX512F

const wideFrom = 256

// wideRun is how much of a run of n elements (a multiple of 8) the AVX-512 kernels take: a multiple of 16,
// the AVX2 kernels running the last group of eight; none where they do not run.
func wideRun(n int) int {
	if wide && n >= wideFrom {
		return n &^ 15
	}
	return 0
}

// The assembly kernels (vec32_amd64.s) each process n elements, n a multiple of 8.
type (
	vvKernel     func(dst, a, b *float32, n int)
	vsKernel     func(dst, a *float32, s float32, n int)
	unaryKernel  func(dst, a *float32, n int)
	selectKernel func(dst, cond, onTrue, onFalse *float32, n int)
)

var (
	vvKernels = [numOps]vvKernel{addVV, subVV, mulVV, divVV, maxVV, minVV, eqVV, neVV, ltVV, leVV, gtVV, geVV}
	vsKernels = [numOps]vsKernel{addVS, subVS, mulVS, divVS, maxVS, minVS, eqVS, neVS, ltVS, leVS, gtVS, geVS}
	// svKernels are s op a for the operations that have no swapped form.
	svKernels = [numOps]vsKernel{Sub: subSV, Div: divSV}
	// Exp has its own kernel: see expAccel.
	unaryKernels = [numUnary]unaryKernel{Neg: negV, Abs: absV, Sqrt: sqrtV, Erf: erfV}
)

// whole is the part of n the kernels take: a multiple of 8.
func whole(n int) int { return n &^ 7 }

func binaryAccel(op Op, dst, a, b []float32) int {
	n := whole(len(dst))
	if !accelerated || n == 0 {
		return 0
	}
	vvKernels[op](unsafe.SliceData(dst), unsafe.SliceData(a), unsafe.SliceData(b), n)
	return n
}

func binaryScalarAccel(op Op, dst, a []float32, s float32) int {
	n := whole(len(dst))
	if !accelerated || n == 0 {
		return 0
	}
	vsKernels[op](unsafe.SliceData(dst), unsafe.SliceData(a), s, n)
	return n
}

func scalarBinaryAccel(op Op, dst []float32, s float32, a []float32) int {
	n := whole(len(dst))
	if !accelerated || n == 0 || svKernels[op] == nil {
		return 0
	}
	svKernels[op](unsafe.SliceData(dst), unsafe.SliceData(a), s, n)
	return n
}

func unaryAccel(u Unary, dst, a []float32) int {
	n := whole(len(dst))
	if !accelerated || n == 0 {
		return 0
	}
	if u == Exp {
		expAccel(dst[:n], a[:n])
		return n
	}
	w := 0
	if u == Erf {
		if w = wideRun(n); w > 0 {
			erfV512(unsafe.SliceData(dst), unsafe.SliceData(a), w)
		}
	}
	if w < n {
		unaryKernels[u](&dst[w], &a[w], n-w)
	}
	return n
}

// expAccel runs the Exp kernel, which computes every lane but the rare subnormal results (x in
// [expZero, expSubnormal)): it leaves x itself there, a negative value no result of exp can be, and reports
// that it met one. Those lanes are then computed exactly from the x left in dst, which also works in place.
func expAccel(dst, a []float32) {
	n, w := len(dst), wideRun(len(dst))
	subnormal := 0
	if w > 0 {
		subnormal = expV512(unsafe.SliceData(dst), unsafe.SliceData(a), w)
	}
	if w < n {
		subnormal |= expV(&dst[w], &a[w], n-w)
	}
	if subnormal == 0 {
		return
	}
	for i, v := range dst {
		if v < 0 {
			dst[i] = expOutside(v)
		}
	}
}

func selectAccel(dst, cond, onTrue, onFalse []float32) int {
	n := whole(len(dst))
	if !accelerated || n == 0 {
		return 0
	}
	selectV(unsafe.SliceData(dst), unsafe.SliceData(cond), unsafe.SliceData(onTrue), unsafe.SliceData(onFalse), n)
	return n
}

// Declared in vec32_amd64.s. None keeps a pointer it is given (go:noescape), so that a caller's arrays can
// stay on its stack.

//go:noescape
func expV512(dst, a *float32, n int) (subnormal int)

//go:noescape
func erfV512(dst, a *float32, n int)

//go:noescape
func addVV(dst, a, b *float32, n int)

//go:noescape
func subVV(dst, a, b *float32, n int)

//go:noescape
func mulVV(dst, a, b *float32, n int)

//go:noescape
func divVV(dst, a, b *float32, n int)

//go:noescape
func maxVV(dst, a, b *float32, n int)

//go:noescape
func minVV(dst, a, b *float32, n int)

//go:noescape
func eqVV(dst, a, b *float32, n int)

//go:noescape
func neVV(dst, a, b *float32, n int)

//go:noescape
func ltVV(dst, a, b *float32, n int)

//go:noescape
func leVV(dst, a, b *float32, n int)

//go:noescape
func gtVV(dst, a, b *float32, n int)

//go:noescape
func geVV(dst, a, b *float32, n int)

//go:noescape
func addVS(dst, a *float32, s float32, n int)

//go:noescape
func subVS(dst, a *float32, s float32, n int)

//go:noescape
func mulVS(dst, a *float32, s float32, n int)

//go:noescape
func divVS(dst, a *float32, s float32, n int)

//go:noescape
func maxVS(dst, a *float32, s float32, n int)

//go:noescape
func minVS(dst, a *float32, s float32, n int)

//go:noescape
func eqVS(dst, a *float32, s float32, n int)

//go:noescape
func neVS(dst, a *float32, s float32, n int)

//go:noescape
func ltVS(dst, a *float32, s float32, n int)

//go:noescape
func leVS(dst, a *float32, s float32, n int)

//go:noescape
func gtVS(dst, a *float32, s float32, n int)

//go:noescape
func geVS(dst, a *float32, s float32, n int)

//go:noescape
func subSV(dst, a *float32, s float32, n int)

//go:noescape
func divSV(dst, a *float32, s float32, n int)

//go:noescape
func negV(dst, a *float32, n int)

//go:noescape
func absV(dst, a *float32, n int)

//go:noescape
func sqrtV(dst, a *float32, n int)

//go:noescape
func erfV(dst, a *float32, n int)

// expV computes e^x for n elements and returns non-zero when some x was in [expZero, expSubnormal), whose
// lane it left holding x.
//
//go:noescape
func expV(dst, a *float32, n int) (subnormal int)

//go:noescape
func selectV(dst, cond, onTrue, onFalse *float32, n int)

func scatter4Accel(sign float32, outA, outB, outC, outD, a, b, c, d, source []float32) int {
	n := whole(len(source))
	if !accelerated || n == 0 {
		return 0
	}
	for _, run := range [][]float32{outA, outB, outC, outD, a, b, c, d} {
		_ = run[n-1]
	}
	scatter4V(unsafe.SliceData(outA), unsafe.SliceData(outB), unsafe.SliceData(outC), unsafe.SliceData(outD),
		unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(c), unsafe.SliceData(d),
		unsafe.SliceData(source), sign, n)
	return n
}

//go:noescape
func scatter4V(outA, outB, outC, outD, a, b, c, d, source *float32, s float32, n int)

func foldAccel(f fold, x []float32, acc *[lanes]float32) bool {
	if !accelerated {
		return false
	}
	switch f {
	case foldSum:
		reduceSumV(&x[0], len(x), acc)
	case foldMax:
		reduceMaxV(&x[0], len(x), acc)
	case foldMin:
		reduceMinV(&x[0], len(x), acc)
	}
	return true
}

// combineAccel folds the running values into one with the assembly when it runs.
func combineAccel(f fold, acc *[lanes]float32) (float32, bool) {
	if !accelerated {
		return 0, false
	}
	switch f {
	case foldMax:
		return combineMaxV(acc), true
	case foldMin:
		return combineMinV(acc), true
	}
	return combineSumV(acc), true
}

//go:noescape
func combineSumV(acc *[lanes]float32) float32

//go:noescape
func combineMaxV(acc *[lanes]float32) float32

//go:noescape
func combineMinV(acc *[lanes]float32) float32

//go:noescape
func reduceSumV(a *float32, n int, acc *[lanes]float32)

//go:noescape
func reduceMaxV(a *float32, n int, acc *[lanes]float32)

//go:noescape
func reduceMinV(a *float32, n int, acc *[lanes]float32)

func fromBoolAccel(dst []float32, src []bool) int {
	n := whole(len(dst))
	if !accelerated || n == 0 {
		return 0
	}
	fromBoolV(unsafe.SliceData(dst), unsafe.SliceData(src), n)
	return n
}

//go:noescape
func fromBoolV(dst *float32, src *bool, n int)

func fillAccel(dst []float32, v float32) int {
	n := whole(len(dst))
	if !accelerated || n == 0 {
		return 0
	}
	fillV(unsafe.SliceData(dst), v, n)
	return n
}

//go:noescape
func fillV(dst *float32, s float32, n int)

func poolRowAccel(isMin bool, out, in []float32, c, groups, rowStride int) bool {
	if !accelerated {
		return false
	}
	if isMin {
		minPoolRowV(&out[0], &in[0], c, groups, rowStride)
	} else {
		maxPoolRowV(&out[0], &in[0], c, groups, rowStride)
	}
	return true
}

func scatterPoolRowAccel(sign float32, grad, in, source []float32, c, groups, rowStride int) bool {
	if !accelerated {
		return false
	}
	scatterPoolRowV(&grad[0], &in[0], &source[0], c, groups, rowStride, sign)
	return true
}

//go:noescape
func maxPoolRowV(out, in *float32, c, groups, rowStride int)

//go:noescape
func minPoolRowV(out, in *float32, c, groups, rowStride int)

//go:noescape
func scatterPoolRowV(grad, in, source *float32, c, groups, rowStride int, s float32)

func sumSquaresAccel(x []float32, acc *[16]float64) bool {
	if !accelerated {
		return false
	}
	sumSquaresV(&x[0], len(x), acc)
	return true
}

//go:noescape
func sumSquaresV(a *float32, n int, acc *[16]float64)

func scaleDevAccel(dst, x, m, f, o []float32) int {
	n := whole(len(dst))
	if !accelerated || n == 0 {
		return 0
	}
	scaleDevV(unsafe.SliceData(dst), unsafe.SliceData(x), unsafe.SliceData(m), unsafe.SliceData(f), unsafe.SliceData(o), n)
	return n
}

func combineDevAccel(dst, g, x, m, a, b, d []float32) int {
	n := whole(len(dst))
	if !accelerated || n == 0 {
		return 0
	}
	combineDevV(unsafe.SliceData(dst), unsafe.SliceData(g), unsafe.SliceData(x), unsafe.SliceData(m),
		unsafe.SliceData(a), unsafe.SliceData(b), unsafe.SliceData(d), n)
	return n
}

//go:noescape
func scaleDevV(dst, x, m, f, o *float32, n int)

//go:noescape
func combineDevV(dst, grad, x, m, a, b, d *float32, n int)

func shiftedMomentsAccel(sum, squares, x, shift []float32) int {
	n := whole(len(sum))
	if !accelerated || n == 0 {
		return 0
	}
	shiftedMomentsV(unsafe.SliceData(sum), unsafe.SliceData(squares), unsafe.SliceData(x), unsafe.SliceData(shift), n)
	return n
}

func gradientMomentsAccel(sum, products, g, x, m []float32) int {
	n := whole(len(sum))
	if !accelerated || n == 0 {
		return 0
	}
	gradientMomentsV(unsafe.SliceData(sum), unsafe.SliceData(products), unsafe.SliceData(g), unsafe.SliceData(x),
		unsafe.SliceData(m), n)
	return n
}

//go:noescape
func shiftedMomentsV(sum, squares, x, shift *float32, n int)

//go:noescape
func gradientMomentsV(sum, products, grad, x, m *float32, n int)

// The layer-norm row passes (layernorm.go), over whole groups of 32 elements.

//go:noescape
func lnSquaresV(x *float32, n int, mean float32, acc *[32]float32)

//go:noescape
func lnOutV(y, x, gain, offset *float32, n int, mean, dev float32)

//go:noescape
func lnProductV(out, x, dy *float32, n int, mean, dev float32)

//go:noescape
func lnGradDevV(x, dy, gain *float32, n int, mean, dev2 float32, acc *[32]float32)

//go:noescape
func lnGradSumV(x, dy, gain *float32, n int, mean, dev, scale float32, acc *[32]float32)

//go:noescape
func lnGradOutV(dx, x, dy, gain *float32, n int, mean, dev, scale, shift float32)

//go:noescape
func lnGradOutResV(dx, x, dy, gain, residual *float32, n int, mean, dev, scale, shift float32)

func lnSquaresAccel(x []float32, mean float32, acc *[lanes]float32) bool {
	if !accelerated {
		return false
	}
	lnSquaresV(&x[0], len(x), mean, acc)
	return true
}

func lnOutAccel(y, x, gain, offset []float32, mean, dev float32) bool {
	if !accelerated {
		return false
	}
	lnOutV(&y[0], &x[0], &gain[0], &offset[0], len(x), mean, dev)
	return true
}

func lnProductAccel(out, x, dy []float32, mean, dev float32) bool {
	if !accelerated {
		return false
	}
	lnProductV(&out[0], &x[0], &dy[0], len(x), mean, dev)
	return true
}

func lnGradDevAccel(x, dy, gain []float32, mean, dev2 float32, acc *[lanes]float32) bool {
	if !accelerated {
		return false
	}
	lnGradDevV(&x[0], &dy[0], &gain[0], len(x), mean, dev2, acc)
	return true
}

func lnGradSumAccel(x, dy, gain []float32, mean, dev, scale float32, acc *[lanes]float32) bool {
	if !accelerated {
		return false
	}
	lnGradSumV(&x[0], &dy[0], &gain[0], len(x), mean, dev, scale, acc)
	return true
}

func lnGradOutAccel(dx, x, dy, gain, residual []float32, mean, dev, scale, shift float32) bool {
	if !accelerated {
		return false
	}
	if residual == nil {
		lnGradOutV(&dx[0], &x[0], &dy[0], &gain[0], len(x), mean, dev, scale, shift)
	} else {
		lnGradOutResV(&dx[0], &x[0], &dy[0], &gain[0], &residual[0], len(x), mean, dev, scale, shift)
	}
	return true
}
