package elementwise

import (
	"math"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
)

// Exp (softmax, cross-entropy) and Erf (the exact GELU) in float32: simplego computes each element in
// float64 through Go's math package, which the transformer's profile showed as a fifth of its step. Here
// they are computed in float32: exp by reduction to r = x − n·ln 2 and Cephes' degree-6 polynomial of
// expf, within 1.5 ulp; erf by the clamped rational approximation that XLA and Eigen use for float32,
// within 4.2e-7 absolute. The tests bound both against Go's math package. float64 stays with simplego.

var expCalls, erfCalls atomicCounter

// unaryFloat32 runs fn over a float32 input, in place when the executor owns it (as simplego does); ok is
// false for other dtypes.
func unaryFloat32(backend *simplego.Backend, inputs []*simplego.Buffer, inputsOwned []bool,
	fn func(in, out []float32)) (*simplego.Buffer, bool) {
	if len(inputs) != 1 {
		return nil, false
	}
	shape, err := backend.BufferShape(inputs[0])
	if err != nil || shape.DType != dtypes.Float32 {
		return nil, false
	}
	output := inputs[0]
	if !inputsOwned[0] {
		if output = backend.NewBuffer(shape); output == nil {
			return nil, false
		}
	}
	in, err1 := backend.BufferData(inputs[0])
	out, err2 := backend.BufferData(output)
	if err1 != nil || err2 != nil {
		if output != inputs[0] {
			_ = backend.BufferFinalize(output)
		}
		return nil, false
	}
	fn(in.([]float32), out.([]float32))
	if output == inputs[0] {
		inputs[0] = nil // simplego's signal that the input buffer lives on as the output.
	}
	return output, true
}

func execExp(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	if output, ok := unaryFloat32(backend, inputs, inputsOwned, exps); ok {
		expCalls.Add(1)
		return output, nil
	}
	return fallbacks[backends.OpTypeExp](backend, node, inputs, inputsOwned)
}

func execErf(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	if output, ok := unaryFloat32(backend, inputs, inputsOwned, erfs); ok {
		erfCalls.Add(1)
		return output, nil
	}
	return fallbacks[backends.OpTypeErf](backend, node, inputs, inputsOwned)
}

func exps(in, out []float32) {
	out = out[:len(in)]
	for i, x := range in {
		if !(x >= expSubnormal && x <= expOverflow) { // NaN included
			out[i] = expOutside(x)
			continue
		}
		// Written out in the loop: the compiler would not inline a function of this size, and a call per
		// element keeps the processor from overlapping consecutive elements' polynomials.
		n := (x*log2e + roundMagic) - roundMagic
		r := x - n*ln2Hi - n*ln2Lo
		p := float32(expP0)
		p = p*r + expP1
		p = p*r + expP2
		p = p*r + expP3
		p = p*r + expP4
		p = p*r + expP5
		k := int32(n)
		half := k >> 1
		out[i] = (p*r*r + r + 1) * math.Float32frombits(uint32(half+127)<<23) * math.Float32frombits(uint32(k-half+127)<<23)
	}
}

func erfs(in, out []float32) {
	out = out[:len(in)]
	for i, x := range in {
		out[i] = erf32(x)
	}
}

// Bounds of exp32's fast path: above, float32 overflows; below, results are subnormal.
const (
	expOverflow  = 88.72283
	expSubnormal = -87.33654
	// Below expZero, e^x rounds to zero in float32 (half the smallest subnormal is e^−103.97).
	expZero = -104
)

// exp32 is e^x in float32, one value (exps is the loop over a tensor).
func exp32(x float32) float32 {
	in, out := [1]float32{x}, [1]float32{}
	exps(in[:], out[:])
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

// The constants of the fast path of exps: e^x for x in [expSubnormal, expOverflow], without a branch, as
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

// erf32 is erf(x) in float32: a rational approximation on [−4, 4], where it reaches ±1 in float32.
func erf32(x float32) float32 {
	if x != x {
		return x
	}
	x = min(max(x, -4), 4)
	x2 := x * x
	p := float32(-2.72614225801306e-10)
	p = p*x2 + 2.77068142495902e-08
	p = p*x2 + -2.10102402082508e-06
	p = p*x2 + -5.69250639462346e-05
	p = p*x2 + -7.34990630326855e-04
	p = p*x2 + -2.95459980854025e-03
	p = p*x2 + -1.60960333262415e-02
	q := float32(-1.45660718464996e-05)
	q = q*x2 + -2.13374055278905e-04
	q = q*x2 + -1.68282697438203e-03
	q = q*x2 + -7.37332916720468e-03
	q = q*x2 + -1.42647390514189e-02
	return x * p / q
}
