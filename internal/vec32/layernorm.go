package vec32

// Layer-norm row passes. Each runs over one row of a layer norm (or its gradient) whose length is a
// positive multiple of 32 (RowPasses), and computes element by element the float32 operations of the
// element-wise calls it stands for, named in its comment, in their order: the results are those calls'
// bit for bit, and a sum among them comes out in Sum's order (32 running sums, i mod 32, combined
// pairwise). One pass instead of three to six calls per row: on rows of 128 (a small transformer's
// features) the calls' overhead, not their arithmetic, was most of the time.

// RowPasses reports whether the row passes take rows of n elements.
func RowPasses(n int) bool { return n > 0 && n%lanes == 0 }

func checkRow(n int) {
	if !RowPasses(n) {
		panic("vec32: a layer-norm row pass needs a row of a positive multiple of 32 elements")
	}
}

// SquaredDeviationsSum is Sum(t) for t = (x − mean)·(x − mean) (BinaryScalar Sub, then Binary Mul),
// without writing t.
func SquaredDeviationsSum(x []float32, mean float32) float32 {
	checkRow(len(x))
	var acc [lanes]float32
	if !lnSquaresAccel(x, mean, &acc) {
		for i, v := range x {
			d := v - mean
			acc[i%lanes] += float32(d * d)
		}
	}
	return combine(foldSum, &acc)
}

// NormalizeAffine sets y = ((x − mean) / deviation)·gain + offset (BinaryScalar Sub and Div, Binary Mul
// and Add). y may be x.
func NormalizeAffine(y, x, gain, offset []float32, mean, deviation float32) {
	checkRow(len(x))
	y, gain, offset = y[:len(x)], gain[:len(x)], offset[:len(x)]
	if lnOutAccel(y, x, gain, offset, mean, deviation) {
		return
	}
	for i, v := range x {
		c := (v - mean) / deviation
		y[i] = float32(c*gain[i]) + offset[i]
	}
}

// NormalizedProduct sets out = dy·((x − mean) / deviation) (BinaryScalar Sub and Div, Binary Mul with dy
// first). out may be dy.
func NormalizedProduct(out, x, dy []float32, mean, deviation float32) {
	checkRow(len(x))
	out, dy = out[:len(x)], dy[:len(x)]
	if lnProductAccel(out, x, dy, mean, deviation) {
		return
	}
	for i, v := range x {
		out[i] = dy[i] * ((v - mean) / deviation)
	}
}

// LayerNormDeviationGradSum is Sum(u) for u = −((dy·gain)·((x − mean) / deviationSquared)) (Binary Mul,
// BinaryScalar Sub and Div, Binary Mul, Apply Neg), without writing u.
func LayerNormDeviationGradSum(x, dy, gain []float32, mean, deviationSquared float32) float32 {
	checkRow(len(x))
	dy, gain = dy[:len(x)], gain[:len(x)]
	var acc [lanes]float32
	if !lnGradDevAccel(x, dy, gain, mean, deviationSquared, &acc) {
		for i, v := range x {
			g := dy[i] * gain[i]
			u := (v - mean) / deviationSquared
			acc[i%lanes] += -float32(g * u)
		}
	}
	return combine(foldSum, &acc)
}

// layerNormGradA is a = (dy·gain)/deviation + c·scale + c·scale with c = x − mean, each operation rounded.
func layerNormGradA(x, dy, gain, mean, deviation, scale float32) float32 {
	a := float32(dy*gain) / deviation
	u := float32((x - mean) * scale)
	a += u
	return a + u
}

// LayerNormGradSum is Sum(a) for a = (dy·gain)/deviation + c·scale + c·scale, c = x − mean (Binary Mul,
// BinaryScalar Div, Sub and Mul, Binary Add twice), without writing a.
func LayerNormGradSum(x, dy, gain []float32, mean, deviation, scale float32) float32 {
	checkRow(len(x))
	dy, gain = dy[:len(x)], gain[:len(x)]
	var acc [lanes]float32
	if !lnGradSumAccel(x, dy, gain, mean, deviation, scale, &acc) {
		for i, v := range x {
			acc[i%lanes] += layerNormGradA(v, dy[i], gain[i], mean, deviation, scale)
		}
	}
	return combine(foldSum, &acc)
}

// LayerNormGradOut sets dx = (residual + a) + shift, or a + shift when residual is nil, for a as in
// LayerNormGradSum. dx may be dy or residual.
func LayerNormGradOut(dx, x, dy, gain, residual []float32, mean, deviation, scale, shift float32) {
	checkRow(len(x))
	dx, dy, gain = dx[:len(x)], dy[:len(x)], gain[:len(x)]
	if residual != nil {
		residual = residual[:len(x)]
	}
	if lnGradOutAccel(dx, x, dy, gain, residual, mean, deviation, scale, shift) {
		return
	}
	for i, v := range x {
		a := layerNormGradA(v, dy[i], gain[i], mean, deviation, scale)
		if residual != nil {
			a = residual[i] + a
		}
		dx[i] = a + shift
	}
}
