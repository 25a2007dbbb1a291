package vec32

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// The guard-band tests place every destination inside a larger buffer whose other elements hold a NaN
// bit pattern no kernel produces from the tests' inputs, run the kernel, and check that the pattern is
// intact outside the destination: a kernel that stores past either end of its slice (a whole vector where
// a few elements were left, or one vector too many) fails them, whatever it writes.

// sentinelBits is the guard bands' float32: a quiet NaN with a payload no operation on the inputs gives.
const sentinelBits = 0x7fc0dead

// guardElems is the width of each guard band: more than a 512-bit vector.
const guardElems = 24

var sentinel = math.Float32frombits(sentinelBits)

// guardLengths are 0 to 70 (every tail and unrolled-loop remainder) and some large lengths (280 takes the
// AVX-512 kernels' single-group loop too).
func guardLengths() []int {
	var lengths []int
	for n := range 71 {
		lengths = append(lengths, n)
	}
	return append(lengths, 127, 257, 280, 1001, 4099, 65537)
}

// guardStarts are the destination's offsets into its buffer past the guard band, in elements: eight
// consecutive ones put it at every position relative to a 32-byte boundary (the assembly's stores are
// unaligned, and a wrong address shows at some misalignment); the largest lengths take three.
func guardStarts(n int) []int {
	if n > 1000 {
		return []int{0, 3, 7}
	}
	return []int{0, 1, 2, 3, 4, 5, 6, 7}
}

// guarded is a destination of n elements start elements into a buffer of sentinels, with guard bands
// on either side.
type guarded struct {
	buf   []float32
	first int // the destination's first element in buf
	n     int
}

func newGuarded(n, start int) guarded {
	g := guarded{buf: make([]float32, guardElems+start+n+guardElems), first: guardElems + start, n: n}
	for i := range g.buf {
		g.buf[i] = sentinel
	}
	return g
}

// dst is the destination: capacity n, so a kernel cannot reach the guards through append or a reslice.
func (g guarded) dst() []float32 { return g.buf[g.first : g.first+g.n : g.first+g.n] }

// check fails t when an element outside dst[:written] no longer holds the sentinel (the guard bands, and
// dst[written:] for a kernel that does only part of dst), or, where wroteAll, an element of dst[:written]
// still does.
func (g guarded) check(t *testing.T, written int, wroteAll bool, format string, args ...any) bool {
	t.Helper()
	for i, v := range g.buf {
		inside := i >= g.first && i < g.first+written
		bits := math.Float32bits(v)
		switch {
		case !inside && bits != sentinelBits:
			where := "before"
			if i >= g.first+g.n {
				where = "after"
			} else if i >= g.first {
				where = "inside, past the elements the kernel does,"
			}
			t.Errorf("%s: element %d %s the destination (at %d, n=%d) was overwritten with %#x",
				fmt.Sprintf(format, args...), i, where, g.first, g.n, bits)
			return false
		case inside && wroteAll && bits == sentinelBits:
			t.Errorf("%s: destination element %d was not written", fmt.Sprintf(format, args...), i-g.first)
			return false
		}
	}
	return true
}

// bothModes runs fn with the assembly (where it runs) and with the Go loops.
func bothModes(fn func(mode string)) {
	if accelerated {
		fn("assembly")
	}
	withGo(func() { fn("go") })
}

// TestGuardBandsElementwise runs every element-wise kernel (each binary operation in its three forms and in
// place, each unary operation, Select, FromBool and Fill) on every guard length and start, through the
// assembly and the Go loops, and checks that nothing outside the destination changed, that every element
// of it was written, and that both give the Go loops' bits.
func TestGuardBandsElementwise(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, n := range guardLengths() {
		// The sources start at their own misalignment, different from the destination's.
		a, b, c := inputs(rng, n+1)[1:], inputs(rng, n+5)[5:], inputs(rng, n+2)[2:]
		s := float32(rng.NormFloat64())
		cond := make([]float32, n)
		bools := make([]bool, n)
		for i := range cond {
			cond[i] = float32(rng.IntN(2))
			bools[i] = rng.IntN(2) == 0
		}
		type kernel struct {
			name    string
			inPlace bool // dst starts as a copy of a, and is a's source
			run     func(dst []float32)
		}
		var kernels []kernel
		for op := range numOps {
			kernels = append(kernels,
				kernel{"Binary(" + op.String() + ")", false, func(dst []float32) { Binary(op, dst, a, b) }},
				kernel{"BinaryScalar(" + op.String() + ")", false, func(dst []float32) { BinaryScalar(op, dst, a, s) }},
				kernel{"ScalarBinary(" + op.String() + ")", false, func(dst []float32) { ScalarBinary(op, dst, s, a) }},
				kernel{"Binary(" + op.String() + ") in place", true, func(dst []float32) { Binary(op, dst, dst, b) }})
		}
		for u := range numUnary {
			kernels = append(kernels,
				kernel{u.String(), false, func(dst []float32) { Apply(u, dst, a) }},
				kernel{u.String() + " in place", true, func(dst []float32) { Apply(u, dst, dst) }})
		}
		kernels = append(kernels,
			kernel{"Select", false, func(dst []float32) { Select(dst, cond, b, c) }},
			kernel{"FromBool", false, func(dst []float32) { FromBool(dst, bools) }},
			kernel{"Fill", false, func(dst []float32) { Fill(dst, s) }})
		for _, k := range kernels {
			want := make([]float32, n)
			if k.inPlace {
				copy(want, a)
			}
			withGo(func() { k.run(want) })
			for _, start := range guardStarts(n) {
				bothModes(func(mode string) {
					g := newGuarded(n, start)
					dst := g.dst()
					if k.inPlace {
						copy(dst, a)
					}
					k.run(dst)
					if g.check(t, n, !k.inPlace, "%s (%s) n=%d start=%d", k.name, mode, n, start) {
						sameBits(t, want, dst, "%s (%s) n=%d start=%d", k.name, mode, n, start)
					}
				})
			}
			if t.Failed() {
				return
			}
		}
	}
}

// TestGuardBandsScatter4Prefix: the four outputs of Scatter4Prefix, each in its guard bands, get exactly
// the prefix it reports (a multiple of 8) and nothing past it.
func TestGuardBandsScatter4Prefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	for _, n := range guardLengths() {
		runs := make([][]float32, 5) // a, b, c, d, source
		for i := range runs {
			runs[i] = inputs(rng, n+i)[i:]
		}
		for _, start := range guardStarts(n) {
			for _, sign := range []float32{1, -1} {
				bothModes(func(mode string) {
					outs := [4]guarded{}
					for i := range outs {
						outs[i] = newGuarded(n, (start+i)%8)
					}
					done := Scatter4Prefix(sign, outs[0].dst(), outs[1].dst(), outs[2].dst(), outs[3].dst(),
						runs[0], runs[1], runs[2], runs[3], runs[4])
					if mode == "go" && done != 0 || done%8 != 0 || done > n {
						t.Fatalf("Scatter4Prefix (%s) n=%d reports %d elements done", mode, n, done)
					}
					for i, out := range outs {
						// Each element of the prefix is the source value or +0: written, never the sentinel.
						if !out.check(t, done, true, "Scatter4Prefix (%s) output %d n=%d start=%d sign=%g", mode, i, n,
							start, sign) {
							return
						}
					}
				})
			}
		}
	}
}

// TestGuardBandsPoolRows: PoolRow2x2 writes its output row and nothing around it, ScatterPoolRow2x2 its
// windows' four positions in grad and nothing else (not the gap between the two rows of windows when
// rowStride is wider, not past the last window), and neither changes its input.
func TestGuardBandsPoolRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	for _, c := range []int{8, 16, 24, 40} {
		for groups := 1; groups <= 9; groups++ {
			for _, gap := range []int{0, 1, 5, 8} {
				rowStride := 2*groups*c + gap
				inLen := rowStride + 2*groups*c
				in := inputs(rng, inLen+3)[3:]
				inCopy := append([]float32(nil), in...)
				source := inputs(rng, groups*c+1)[1:]
				for _, start := range []int{0, 1, 5} {
					name := fmt.Sprintf("c=%d groups=%d rowStride=%d start=%d", c, groups, rowStride, start)
					bothModes(func(mode string) {
						for _, isMin := range []bool{false, true} {
							out := newGuarded(groups*c, start)
							ran := PoolRow2x2(isMin, out.dst(), in, c, groups, rowStride)
							written := 0
							if ran {
								written = groups * c
							}
							out.check(t, written, true, "PoolRow2x2(isMin=%v) (%s) %s", isMin, mode, name)
						}
						for _, sign := range []float32{1, -1} {
							grad := newGuarded(inLen, start)
							ran := ScatterPoolRow2x2(sign, grad.dst(), in, source, c, groups, rowStride)
							// The windows cover [0, 2·groups·c) and [rowStride, rowStride + 2·groups·c) of grad: with
							// no gap that is all of it; with one, the gap must keep its sentinels.
							written := 0
							if ran {
								written = 2 * groups * c
							}
							gradDst := grad.dst()
							for i := rowStride; i < rowStride+written; i++ {
								if math.Float32bits(gradDst[i]) == sentinelBits {
									t.Errorf("ScatterPoolRow2x2 (%s) %s: grad[%d] in the second row of windows not written",
										mode, name, i)
									return
								}
								gradDst[i] = sentinel // so that check sees the second row as the guards' value
							}
							grad.check(t, written, true, "ScatterPoolRow2x2(sign=%g) (%s) %s", sign, mode, name)
						}
					})
					sameBits(t, inCopy, in, "%s: the input changed", name)
					if t.Failed() {
						return
					}
				}
			}
		}
	}
}
