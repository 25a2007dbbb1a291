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
	total := combineSum(&acc)
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
	if f == foldMin {
		result := combineMin(&acc)
		for _, v := range x[whole:] {
			result = min(result, v)
		}
		return result
	}
	result := combineMax(&acc)
	for _, v := range x[whole:] {
		result = max(result, v)
	}
	return result
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

// combineSum, combineMax and combineMin fold the running values pairwise into one: l with l+16, then l+8,
// l+4, l+2, l+1 (three loops written out: a call per pair would cost more than the pairs).
func combineSum(acc *[lanes]float32) float32 {
	for width := lanes / 2; width >= 1; width /= 2 {
		for l := range width {
			acc[l] += acc[l+width]
		}
	}
	return acc[0]
}

func combineMax(acc *[lanes]float32) float32 {
	for width := lanes / 2; width >= 1; width /= 2 {
		for l := range width {
			acc[l] = max(acc[l], acc[l+width])
		}
	}
	return acc[0]
}

func combineMin(acc *[lanes]float32) float32 {
	for width := lanes / 2; width >= 1; width /= 2 {
		for l := range width {
			acc[l] = min(acc[l], acc[l+width])
		}
	}
	return acc[0]
}

// SumSquares returns the sum of the squares of x in float64 (each element widened before it is squared), in
// a fixed order: 16 running sums (x[i] goes to sum i mod 16) over the longest prefix of whole groups of 16,
// added pairwise, then the remaining elements one by one.
func SumSquares(x []float32) float64 {
	var acc [16]float64
	whole := len(x) / 16 * 16
	if whole > 0 && !sumSquaresAccel(x[:whole], &acc) {
		for i := 0; i < whole; i += 16 {
			for l, v := range x[i : i+16] {
				acc[l] += float64(v) * float64(v)
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
		total += float64(v) * float64(v)
	}
	return total
}
