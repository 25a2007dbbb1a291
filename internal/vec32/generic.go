package vec32

import "math"

// The Go loops: what runs without AVX2, the tail of every run the assembly leaves (fewer than eight
// elements), and the reference the assembly is tested against. Each switch picks a loop once per call, so
// that the loops themselves hold no call and no branch on the operation.

func binaryGo(op Op, dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	switch op {
	case Add:
		for i := range dst {
			dst[i] = a[i] + b[i]
		}
	case Sub:
		for i := range dst {
			dst[i] = a[i] - b[i]
		}
	case Mul:
		for i := range dst {
			dst[i] = a[i] * b[i]
		}
	case Div:
		for i := range dst {
			dst[i] = a[i] / b[i]
		}
	case Max:
		for i := range dst {
			dst[i] = max(a[i], b[i])
		}
	case Min:
		for i := range dst {
			dst[i] = min(a[i], b[i])
		}
	case Equal:
		for i := range dst {
			dst[i] = mask(a[i] == b[i])
		}
	case NotEqual:
		for i := range dst {
			dst[i] = mask(a[i] != b[i])
		}
	case LessThan:
		for i := range dst {
			dst[i] = mask(a[i] < b[i])
		}
	case LessOrEqual:
		for i := range dst {
			dst[i] = mask(a[i] <= b[i])
		}
	case GreaterThan:
		for i := range dst {
			dst[i] = mask(a[i] > b[i])
		}
	case GreaterOrEqual:
		for i := range dst {
			dst[i] = mask(a[i] >= b[i])
		}
	default:
		panic("vec32: unknown operation " + op.String())
	}
}

func binaryScalarGo(op Op, dst, a []float32, s float32) {
	a = a[:len(dst)]
	switch op {
	case Add:
		for i := range dst {
			dst[i] = a[i] + s
		}
	case Sub:
		for i := range dst {
			dst[i] = a[i] - s
		}
	case Mul:
		for i := range dst {
			dst[i] = a[i] * s
		}
	case Div:
		for i := range dst {
			dst[i] = a[i] / s
		}
	case Max:
		for i := range dst {
			dst[i] = max(a[i], s)
		}
	case Min:
		for i := range dst {
			dst[i] = min(a[i], s)
		}
	case Equal:
		for i := range dst {
			dst[i] = mask(a[i] == s)
		}
	case NotEqual:
		for i := range dst {
			dst[i] = mask(a[i] != s)
		}
	case LessThan:
		for i := range dst {
			dst[i] = mask(a[i] < s)
		}
	case LessOrEqual:
		for i := range dst {
			dst[i] = mask(a[i] <= s)
		}
	case GreaterThan:
		for i := range dst {
			dst[i] = mask(a[i] > s)
		}
	case GreaterOrEqual:
		for i := range dst {
			dst[i] = mask(a[i] >= s)
		}
	default:
		panic("vec32: unknown operation " + op.String())
	}
}

// scalarBinaryGo is s op a[i] for the operations without a swapped form.
func scalarBinaryGo(op Op, dst []float32, s float32, a []float32) {
	a = a[:len(dst)]
	switch op {
	case Sub:
		for i := range dst {
			dst[i] = s - a[i]
		}
	case Div:
		for i := range dst {
			dst[i] = s / a[i]
		}
	default:
		swapped, _ := op.Swapped()
		binaryScalarGo(swapped, dst, a, s)
	}
}

func unaryGo(u Unary, dst, a []float32) {
	a = a[:len(dst)]
	switch u {
	case Neg:
		for i := range dst {
			dst[i] = -a[i]
		}
	case Abs:
		for i, x := range a {
			if x < 0 {
				x = -x
			}
			dst[i] = x
		}
	case Sqrt:
		for i := range dst {
			dst[i] = float32(math.Sqrt(float64(a[i])))
		}
	case Exp:
		expGo(dst, a)
	case Erf:
		for i := range dst {
			dst[i] = erf32(a[i])
		}
	default:
		panic("vec32: unknown operation " + u.String())
	}
}

func selectGo(dst, cond, onTrue, onFalse []float32) {
	cond, onTrue, onFalse = cond[:len(dst)], onTrue[:len(dst)], onFalse[:len(dst)]
	for i := range dst {
		if cond[i] != 0 {
			dst[i] = onTrue[i]
		} else {
			dst[i] = onFalse[i]
		}
	}
}

// mask is a condition as a float32: 1 or 0. The compiler turns it into a set instruction, without a
// branch.
func mask(b bool) float32 {
	var m float32
	if b {
		m = 1
	}
	return m
}

// Exp and Erf in float32: GoMLX's pure-Go backend computes each element in float64 through Go's math
// package, a fifth of a transformer's step. Here exp goes by reduction to r = x − n·ln 2 and Cephes'
// degree-6 polynomial of expf, within 1.5 ulp; erf by the clamped rational approximation that XLA and
// Eigen use for float32, within 4.2e-7 absolute. The tests bound both against Go's math package.

func expGo(dst, a []float32) {
	a = a[:len(dst)]
	for i, x := range a {
		if !(x >= expSubnormal && x <= expOverflow) { // NaN included
			dst[i] = expOutside(x)
			continue
		}
		// Written out in the loop: the compiler would not inline a function of this size, and a call per
		// element keeps the processor from overlapping consecutive elements' polynomials. The assembly
		// computes the same operations in the same order, each product rounded before it is added: the
		// explicit float32(…) around every product that feeds an addition keeps the compiler from fusing
		// the two into a multiply-add (as it does for GOAMD64=v3 and on arm64), which would round once
		// instead of twice and give other bits than the assembly's.
		n := (float32(x*log2e) + roundMagic) - roundMagic
		r := x - float32(n*ln2Hi) - float32(n*ln2Lo)
		p := float32(expP0)
		p = float32(p*r) + expP1
		p = float32(p*r) + expP2
		p = float32(p*r) + expP3
		p = float32(p*r) + expP4
		p = float32(p*r) + expP5
		k := int32(n)
		half := k >> 1
		e := float32(float32(p*r)*r) + r + 1
		dst[i] = e * math.Float32frombits(uint32(half+127)<<23) * math.Float32frombits(uint32(k-half+127)<<23)
	}
}

// Bounds of exp's fast path: above, float32 overflows; below, results are subnormal.
const (
	expOverflow  = 88.72283
	expSubnormal = -87.33654
	// Below expZero, e^x rounds to zero in float32 (half the smallest subnormal is e^−103.97).
	expZero = -104
)

// Exp32 is e^x in float32, for one value.
func Exp32(x float32) float32 {
	in, out := [1]float32{x}, [1]float32{}
	expGo(out[:], in[:])
	return out[0]
}

// expOutside is e^x where the result is not a normal float32: NaN, overflow, subnormal or zero. A masked
// softmax score (float32's lowest value) lands here for half a causal attention matrix, so zero comes
// first and cheaply.
func expOutside(x float32) float32 {
	switch {
	case x < expZero:
		return 0
	case x != x:
		return x
	case x > expOverflow:
		return float32(math.Inf(1))
	}
	return float32(math.Exp(float64(x))) // Subnormal: rare, done exactly.
}

// The constants of exp's fast path: e^x for x in [expSubnormal, expOverflow], without a branch, as
// x = n·ln 2 + r with |r| ≤ ln 2 / 2, e^r by Cephes' polynomial, and 2^n built in the exponent bits in two
// halves (n reaches 128, whose 2^n alone is not a float32).
const (
	log2e = 1.44269504088896341
	ln2Hi = 0.693359375 // ln 2 split so that n·ln2Hi is exact
	ln2Lo = -2.12194440e-4
	// Adding and subtracting 1.5·2^23 rounds a float32 of magnitude below 2^22 to the nearest integer.
	roundMagic = 12582912
	// Cephes' expf polynomial.
	expP0 = 1.9875691500e-4
	expP1 = 1.3981999507e-3
	expP2 = 8.3334519073e-3
	expP3 = 4.1665795894e-2
	expP4 = 1.6666665459e-1
	expP5 = 5.0000001201e-1
)

// The rational approximation of erf on [−erfClamp, erfClamp], where erf reaches ±1 in float32:
// erf(x) = x·P(x²)/Q(x²).
const erfClamp = 4

var (
	erfP = [...]float32{-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
		-5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02}
	erfQ = [...]float32{-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
		-7.37332916720468e-03, -1.42647390514189e-02}
)

// erf32 is erf(x) in float32.
func erf32(x float32) float32 {
	if x != x {
		return x
	}
	x = min(max(x, -erfClamp), erfClamp)
	x2 := x * x
	// float32(…) rounds each product before the addition, as the assembly does (see expGo).
	p := erfP[0]
	for _, c := range erfP[1:] {
		p = float32(p*x2) + c
	}
	q := erfQ[0]
	for _, c := range erfQ[1:] {
		q = float32(q*x2) + c
	}
	return x * p / q
}

// Erf32 is erf(x) in float32, for one value.
func Erf32(x float32) float32 { return erf32(x) }

// The Go loops of batch normalization's kernels (vec32.go's AddShiftedMoments and the rest), every product
// rounded to float32 before it is added, as the assembly computes it.
func scaleDevGo(dst, x, m, f, o []float32) {
	x, m, f, o = x[:len(dst)], m[:len(dst)], f[:len(dst)], o[:len(dst)]
	for i := range dst {
		dst[i] = float32((x[i]-m[i])*f[i]) + o[i]
	}
}

func combineDevGo(dst, g, x, m, a, b, d []float32) {
	g, x, m, a, b, d = g[:len(dst)], x[:len(dst)], m[:len(dst)], a[:len(dst)], b[:len(dst)], d[:len(dst)]
	for i := range dst {
		dst[i] = (float32(g[i]*a[i]) + float32((x[i]-m[i])*b[i])) + d[i]
	}
}

func shiftedMomentsGo(sum, squares, x, shift []float32) {
	squares, x, shift = squares[:len(sum)], x[:len(sum)], shift[:len(sum)]
	for i := range sum {
		d := x[i] - shift[i]
		squares[i] += float32(d * d)
		sum[i] += d
	}
}

func gradientMomentsGo(sum, products, g, x, m []float32) {
	products, g, x, m = products[:len(sum)], g[:len(sum)], x[:len(sum)], m[:len(sum)]
	for i := range sum {
		products[i] += float32(g[i] * (x[i] - m[i]))
		sum[i] += g[i]
	}
}
