package vec32

// lanes is the number of running sums (or extremes) a reduction keeps: four registers of eight.
const lanes = 32

type fold uint8

const (
	foldSum fold = iota
	foldMax
	foldMin
)

// Sum returns the sum of x, in a fixed order that does not depend on the processor: 32 running sums (x[i]
// goes to sum i mod 32) over the longest prefix of whole groups of 32, added pairwise (sum l with sum l+16,
// then l+8, l+4, l+2, l+1), then the remaining elements one by one. On long runs this is both faster than
// one running sum (eight lanes, four chains) and more accurate (each sum holds a 32nd of the terms); below
// 32 elements it is the plain running sum.
func Sum(x []float32) float32 {
	var acc [lanes]float32
	whole := len(x) / lanes * lanes
	foldAll(foldSum, x[:whole], &acc)
	total := combine(foldSum, &acc)
	for _, v := range x[whole:] {
		total += v
	}
	return total
}

// MaxOf returns Go's max of initial and every element of x; MinOf its min. Both are associative and
// commutative (NaN wins, +0 is larger than −0), so the 32 running extremes give the result of one.
func MaxOf(x []float32, initial float32) float32 { return extreme(foldMax, x, initial) }

// MinOf returns Go's min of initial and every element of x (see MaxOf).
func MinOf(x []float32, initial float32) float32 { return extreme(foldMin, x, initial) }

func extreme(f fold, x []float32, initial float32) float32 {
	var acc [lanes]float32
	for l := range acc {
		acc[l] = initial
	}
	whole := len(x) / lanes * lanes
	foldAll(f, x[:whole], &acc)
	// The rest folds as one more group of 32, not element by element: the last 32 elements again (max and
	// min are idempotent, so an element seen twice changes nothing), or, in a run shorter than 32, the run
	// padded with initial (already in every running value).
	switch {
	case whole == len(x):
	case whole > 0:
		foldAll(f, x[len(x)-lanes:], &acc)
	default:
		padded := acc
		copy(padded[:], x)
		foldAll(f, padded[:], &acc)
	}
	return combine(f, &acc)
}

// foldAll folds x (a multiple of 32 elements) into the running values, with the assembly when it runs.
func foldAll(f fold, x []float32, acc *[lanes]float32) {
	if len(x) == 0 {
		return
	}
	if !foldAccel(f, x, acc) {
		foldGo(f, x, acc)
	}
}

// foldGo is the Go form of the assembly's folds: acc[i mod 32] ⊕= x[i] in increasing i.
func foldGo(f fold, x []float32, acc *[lanes]float32) {
	for i := 0; i < len(x); i += lanes {
		chunk := x[i : i+lanes]
		switch f {
		case foldSum:
			for l, v := range chunk {
				acc[l] += v
			}
		case foldMax:
			for l, v := range chunk {
				acc[l] = max(acc[l], v)
			}
		case foldMin:
			for l, v := range chunk {
				acc[l] = min(acc[l], v)
			}
		}
	}
}

// combine folds the running values into one: the assembly's combines, or the Go ones below.
func combine(f fold, acc *[lanes]float32) float32 {
	if total, ok := combineAccel(f, acc); ok {
		return total
	}
	switch f {
	case foldMax:
		return combineMax(acc)
	case foldMin:
		return combineMin(acc)
	}
	return combineSum(acc)
}

// combineSum, combineMax and combineMin fold the running values pairwise into one: l with l+16, then l+8,
// l+4, l+2, l+1. Written out with named values, so the compiler keeps them in registers with no bounds
// checks: on softmax's rows of 64 the loops over the array cost more than the fold itself.
func combineSum(a *[lanes]float32) float32 {
	s0, s1, s2, s3 := a[0]+a[16], a[1]+a[17], a[2]+a[18], a[3]+a[19]
	s4, s5, s6, s7 := a[4]+a[20], a[5]+a[21], a[6]+a[22], a[7]+a[23]
	s8, s9, s10, s11 := a[8]+a[24], a[9]+a[25], a[10]+a[26], a[11]+a[27]
	s12, s13, s14, s15 := a[12]+a[28], a[13]+a[29], a[14]+a[30], a[15]+a[31]
	s0, s1, s2, s3 = s0+s8, s1+s9, s2+s10, s3+s11
	s4, s5, s6, s7 = s4+s12, s5+s13, s6+s14, s7+s15
	s0, s1, s2, s3 = s0+s4, s1+s5, s2+s6, s3+s7
	s0, s1 = s0+s2, s1+s3
	return s0 + s1
}

func combineMax(a *[lanes]float32) float32 {
	s0, s1, s2, s3 := max(a[0], a[16]), max(a[1], a[17]), max(a[2], a[18]), max(a[3], a[19])
	s4, s5, s6, s7 := max(a[4], a[20]), max(a[5], a[21]), max(a[6], a[22]), max(a[7], a[23])
	s8, s9, s10, s11 := max(a[8], a[24]), max(a[9], a[25]), max(a[10], a[26]), max(a[11], a[27])
	s12, s13, s14, s15 := max(a[12], a[28]), max(a[13], a[29]), max(a[14], a[30]), max(a[15], a[31])
	s0, s1, s2, s3 = max(s0, s8), max(s1, s9), max(s2, s10), max(s3, s11)
	s4, s5, s6, s7 = max(s4, s12), max(s5, s13), max(s6, s14), max(s7, s15)
	s0, s1, s2, s3 = max(s0, s4), max(s1, s5), max(s2, s6), max(s3, s7)
	s0, s1 = max(s0, s2), max(s1, s3)
	return max(s0, s1)
}

func combineMin(a *[lanes]float32) float32 {
	s0, s1, s2, s3 := min(a[0], a[16]), min(a[1], a[17]), min(a[2], a[18]), min(a[3], a[19])
	s4, s5, s6, s7 := min(a[4], a[20]), min(a[5], a[21]), min(a[6], a[22]), min(a[7], a[23])
	s8, s9, s10, s11 := min(a[8], a[24]), min(a[9], a[25]), min(a[10], a[26]), min(a[11], a[27])
	s12, s13, s14, s15 := min(a[12], a[28]), min(a[13], a[29]), min(a[14], a[30]), min(a[15], a[31])
	s0, s1, s2, s3 = min(s0, s8), min(s1, s9), min(s2, s10), min(s3, s11)
	s4, s5, s6, s7 = min(s4, s12), min(s5, s13), min(s6, s14), min(s7, s15)
	s0, s1, s2, s3 = min(s0, s4), min(s1, s5), min(s2, s6), min(s3, s7)
	s0, s1 = min(s0, s2), min(s1, s3)
	return min(s0, s1)
}

// SumSquares returns the sum of the squares of x in float64 (each element widened before it is squared), in
// a fixed order: 16 running sums (x[i] goes to sum i mod 16) over the longest prefix of whole groups of 16,
// added pairwise, then the remaining elements one by one. Each square is rounded to float64 before it is
// added (no fused multiply-add), in the assembly and in Go alike.
func SumSquares(x []float32) float64 {
	var acc [16]float64
	whole := len(x) / 16 * 16
	if whole > 0 && !sumSquaresAccel(x[:whole], &acc) {
		for i := 0; i < whole; i += 16 {
			for l, v := range x[i : i+16] {
				acc[l] += float64(float64(v) * float64(v)) // rounded before the addition, as in the assembly
			}
		}
	}
	for width := 8; width >= 1; width /= 2 {
		for l := range width {
			acc[l] += acc[l+width]
		}
	}
	total := acc[0]
	for _, v := range x[whole:] {
		total += float64(float64(v) * float64(v))
	}
	return total
}
