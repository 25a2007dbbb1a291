package fusion

import (
	"fmt"
	"math"
	"sync"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/threads"
	"github.com/goaccel/goaccel/internal/vec32"
)

// Products in these kernels are written float32(a*b) where a sum follows: the conversion rounds the product,
// which keeps the compiler from fusing it into a multiply-add on GOAMD64=v3 (the bits must not depend on the
// build's instruction level).

// rowScratch is a row's worth of float32 scratch, and the mask rows' prefix lengths.
type rowScratch struct {
	row      []float32
	prefixes []int32
}

// rowLayout says how a [rows, n] tensor's rows find their rows of a mask that broadcasts over some of the
// leading axes (a causal mask [1, T, 1, T] under attention scores [b, T, h, T]).
type rowLayout struct {
	shape    shapes.Shape // the rows' tensor
	n, rows  int
	maskDims []int // the mask's dimensions laid over the shape's (1 where it broadcasts); nil: no mask
	scratch  sync.Pool
	width    int // rows of scratch a kernel needs (0: one)
}

func newRowLayout(shape shapes.Shape, maskDims []int) *rowLayout {
	n := shape.Dimensions[shape.Rank()-1]
	rows := 0
	if n > 0 {
		rows = shape.Size() / n
	}
	return &rowLayout{shape: shape.Clone(), n: n, rows: rows, maskDims: maskDims}
}

func (l *rowLayout) state() *rowScratch {
	if s, ok := l.scratch.Get().(*rowScratch); ok {
		return s
	}
	return &rowScratch{row: make([]float32, l.n*max(l.width, 1))}
}

// splitRows calls fn on ranges of rows that cover every row once, with scratch of its own for each range:
// on the compute threads when the tensor is large enough (threads.Split), else in one call here.
func (l *rowLayout) splitRows(fn func(s *rowScratch, first, end int)) {
	workers := min(threads.Budget(), l.rows)
	if l.rows*l.n < parallelElements || workers < 2 {
		s := l.state()
		fn(s, 0, l.rows)
		l.scratch.Put(s)
		return
	}
	threads.Split(workers, func(w int) {
		s := l.state()
		fn(s, l.rows*w/workers, l.rows*(w+1)/workers)
		l.scratch.Put(s)
	})
}

// maskRows is the number of rows of the mask's (source) tensor.
func (l *rowLayout) maskRows() int {
	rows := 1
	for _, d := range l.maskDims[:len(l.maskDims)-1] {
		rows *= d
	}
	return rows
}

// prefixes sets, for every row of the mask, the length of its leading run of trues when every element
// after it is false (a causal mask's rows), or −1.
func (l *rowLayout) prefixes(s *rowScratch, mask []bool) []int32 {
	rows := l.maskRows()
	if cap(s.prefixes) < rows {
		s.prefixes = make([]int32, rows)
	}
	p := s.prefixes[:rows]
	for r := range p {
		row := mask[r*l.n : (r+1)*l.n]
		length := 0
		for length < len(row) && row[length] {
			length++
		}
		p[r] = int32(length)
		for _, v := range row[length:] {
			if v {
				p[r] = -1
				break
			}
		}
	}
	return p
}

// forRows calls fn for rows [first, end) with each row's index and its mask row's index (0 without a mask),
// walking the leading axes as an odometer so that a broadcast mask costs no division per row.
func (l *rowLayout) forRows(first, end int, fn func(row, maskRow int)) {
	if l.maskDims == nil {
		for r := first; r < end; r++ {
			fn(r, 0)
		}
		return
	}
	lead := l.shape.Dimensions[:l.shape.Rank()-1]
	// strides[a]: how far the mask row moves per step of axis a (0 where the mask broadcasts).
	strides := make([]int, len(lead))
	stride := 1
	for a := len(lead) - 1; a >= 0; a-- {
		if l.maskDims[a] != 1 {
			strides[a] = stride
		}
		stride *= l.maskDims[a]
	}
	// The odometer's reading at row first.
	index := make([]int, len(lead))
	maskRow := 0
	for a, rest := len(lead)-1, first; a >= 0; a-- {
		index[a] = rest % lead[a]
		rest /= lead[a]
		maskRow += index[a] * strides[a]
	}
	for r := first; r < end; r++ {
		fn(r, maskRow)
		for a := len(lead) - 1; a >= 0; a-- {
			index[a]++
			maskRow += strides[a]
			if index[a] < lead[a] {
				break
			}
			maskRow -= strides[a] * index[a]
			index[a] = 0
		}
	}
}

// buffers reads the inputs' data, and picks the output: input reuse (when owned, simplego's contract), else
// a new buffer.
func rowBuffers(backend *simplego.Backend, what string, shape shapes.Shape, inputs []*simplego.Buffer,
	inputsOwned []bool, reuse int) (data []any, output *simplego.Buffer, out []float32, err error) {
	data = make([]any, len(inputs))
	for i, in := range inputs {
		if data[i], err = backend.BufferData(in); err != nil {
			return nil, nil, nil, fmt.Errorf("fusion: %s: input %d: %w", what, i, err)
		}
	}
	if inputsOwned[reuse] {
		output, inputs[reuse] = inputs[reuse], nil // simplego's signal that the input lives on as the output
	} else if output = backend.NewBuffer(shape); output == nil {
		return nil, nil, nil, fmt.Errorf("fusion: %s: the backend could not allocate the output %s", what, shape)
	}
	flat, err := backend.BufferData(output)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("fusion: %s: output: %w", what, err)
	}
	return data, output, flat.([]float32), nil
}

// softmaxKernel is a softmax along the last axis (forward), or its gradient with respect to the logits.
// Inputs: forward, the logits and the mask (if masked); gradient, the softmax's result y, the incoming
// gradient g, and the mask.
type softmaxKernel struct {
	layout    *rowLayout
	masked    bool
	maskValue float32
	gradient  bool
}

func (k *softmaxKernel) name() string {
	if k.gradient {
		return "softmax gradient"
	}
	return "softmax"
}

func (k *softmaxKernel) run(backend *simplego.Backend, inputs []*simplego.Buffer, inputsOwned []bool) (*simplego.Buffer, error) {
	want := 1
	if k.gradient {
		want++
	}
	if k.masked {
		want++
	}
	if len(inputs) != want {
		return nil, fmt.Errorf("fusion: %s: %d inputs, want %d", k.name(), len(inputs), want)
	}
	reuse := 0 // the logits, or the incoming gradient: same shape, read before written row by row
	if k.gradient {
		reuse = 1
	}
	data, output, out, err := rowBuffers(backend, k.name(), k.layout.shape, inputs, inputsOwned, reuse)
	if err != nil {
		return nil, err
	}
	l := k.layout
	var prefix []int32
	var mask []bool
	if k.masked {
		mask = data[want-1].([]bool)
		s := l.state() // holds the prefixes until every row is done
		defer l.scratch.Put(s)
		prefix = l.prefixes(s, mask)
	}
	n := l.n
	if k.gradient {
		y, g := data[0].([]float32), data[1].([]float32)
		l.splitRows(func(s *rowScratch, first, end int) {
			l.forRows(first, end, func(r, maskRow int) {
				length := unmasked(prefix, maskRow, n)
				lo, hi := r*n, (r+1)*n
				if length < 0 {
					softmaxGradientMasked(out[lo:hi], y[lo:hi], g[lo:hi], mask[maskRow*n:(maskRow+1)*n], s.row)
					return
				}
				softmaxGradientRow(out[lo:hi], y[lo:hi], g[lo:hi], length, s.row)
			})
		})
		return output, nil
	}
	x := data[0].([]float32)
	l.splitRows(func(s *rowScratch, first, end int) {
		l.forRows(first, end, func(r, maskRow int) {
			length := unmasked(prefix, maskRow, n)
			lo, hi := r*n, (r+1)*n
			if length < 0 {
				softmaxMasked(out[lo:hi], x[lo:hi], mask[maskRow*n:(maskRow+1)*n], k.maskValue, s.row)
				return
			}
			softmaxRow(out[lo:hi], x[lo:hi], length, k.maskValue)
		})
	})
	return output, nil
}

// softmaxRow is GoMLX's (masked) softmax of one row whose first length elements are unmasked, operation for
// operation: the same values as its graph on goaccel's executors. y may be x.
//
//	m = max(x[i] where unmasked, else maskValue)   (ReduceMax of the Where; maskValue only if one is masked)
//	e = exp(x − m) where unmasked, else 0          (Exp of Where(mask, x − m, 0), masked again)
//	y = e / Σ e where unmasked, else 0             (the sum over the whole row, zeros included)
func softmaxRow(y, x []float32, length int, maskValue float32) {
	if length == 0 {
		// Every element masked: GoMLX's Where picks 0 from 0/0.
		clear(y)
		return
	}
	initial := float32(math.Inf(-1))
	if length < len(x) {
		initial = maskValue
	}
	m := vec32.MaxOf(x[:length], initial)
	// The element-wise steps run over whole vectors of 8 past the unmasked prefix where the row allows
	// (vec32 computes a last partial vector element by element): the masked elements computed on the way
	// are cleared before anything reads them.
	whole := min(len(x), (length+7)&^7)
	vec32.BinaryScalar(vec32.Sub, y[:whole], x[:whole], m)
	vec32.Apply(vec32.Exp, y[:whole], y[:whole])
	clear(y[length:])
	// The masked zeros are summed too: vec32.Sum's order depends on the row's length, not on its values.
	sum := vec32.Sum(y)
	vec32.BinaryScalar(vec32.Div, y[:whole], y[:whole], sum)
	clear(y[length:whole])
}

// softmaxMasked is softmaxRow for a mask row that is not a prefix; t is scratch of the row's length.
func softmaxMasked(y, x []float32, mask []bool, maskValue float32, t []float32) {
	t = t[:len(x)]
	for i, keep := range mask {
		t[i] = maskValue
		if keep {
			t[i] = x[i]
		}
	}
	m := vec32.MaxOf(t, float32(math.Inf(-1)))
	for i, keep := range mask {
		t[i] = 0
		if keep {
			t[i] = x[i] - m
		}
	}
	vec32.Apply(vec32.Exp, t, t)
	for i, keep := range mask {
		if !keep {
			t[i] = 0
		}
	}
	sum := vec32.Sum(t)
	for i, keep := range mask {
		y[i] = 0
		if keep {
			y[i] = t[i] / sum
		}
	}
}

// softmaxGradientRow is the gradient of a softmax row with respect to its logits, y·(g − Σ y·g), over the
// first length (unmasked) elements, and 0 elsewhere. dx may be g; t is scratch of the row's length.
func softmaxGradientRow(dx, y, g []float32, length int, t []float32) {
	t = t[:length]
	vec32.Binary(vec32.Mul, t, y[:length], g[:length])
	dot := vec32.Sum(t)
	vec32.BinaryScalar(vec32.Sub, t, g[:length], dot)
	vec32.Binary(vec32.Mul, dx[:length], y[:length], t)
	clear(dx[length:])
}

// softmaxGradientMasked is softmaxGradientRow for a mask row that is not a prefix: only unmasked elements
// count (GoMLX masks the incoming gradient first, so a masked infinity does not reach the sum).
func softmaxGradientMasked(dx, y, g []float32, mask []bool, t []float32) {
	t = t[:len(y)]
	for i, keep := range mask {
		t[i] = 0
		if keep {
			t[i] = y[i] * g[i]
		}
	}
	dot := vec32.Sum(t)
	for i, keep := range mask {
		v := float32(0)
		if keep {
			v = y[i] * (g[i] - dot)
		}
		dx[i] = v
	}
}

// layerNormKernel is a layer norm along the last axis with a gain and an offset. Inputs: x, the gain and
// the offset (n values each).
type layerNormKernel struct {
	layout        *rowLayout
	invN, epsilon float32
}

func (k *layerNormKernel) name() string { return "layer norm" }

func (k *layerNormKernel) run(backend *simplego.Backend, inputs []*simplego.Buffer, inputsOwned []bool) (*simplego.Buffer, error) {
	if len(inputs) != 3 {
		return nil, fmt.Errorf("fusion: %s: %d inputs, want 3", k.name(), len(inputs))
	}
	data, output, out, err := rowBuffers(backend, k.name(), k.layout.shape, inputs, inputsOwned, 0)
	if err != nil {
		return nil, err
	}
	x, gain, offset := data[0].([]float32), data[1].([]float32), data[2].([]float32)
	n := k.layout.n
	k.layout.splitRows(func(s *rowScratch, first, end int) {
		for r := first; r < end; r++ {
			layerNormRow(out[r*n:(r+1)*n], x[r*n:(r+1)*n], gain, offset, k.invN, k.epsilon, s.row)
		}
	})
	return output, nil
}

// layerNormRow is GoMLX's layer norm of one row, operation for operation (the same values as its graph on
// goaccel's executors); y may be x, t is scratch of the row's length.
//
//	c = x − Σx·(1/n);  y = c / √(Σc²·(1/n) + ε) · gain + offset
func layerNormRow(y, x, gain, offset []float32, invN, epsilon float32, t []float32) {
	if vec32.RowPasses(len(x)) {
		mean, deviation := meanAndDeviation(x, invN, epsilon)
		vec32.NormalizeAffine(y, x, gain, offset, mean, deviation)
		return
	}
	layerNormRowCalls(y, x, gain, offset, invN, epsilon, t)
}

// layerNormRowCalls is layerNormRow one element-wise call per operation: rows of any length.
func layerNormRowCalls(y, x, gain, offset []float32, invN, epsilon float32, t []float32) {
	deviation := centre(y, x, invN, epsilon, t)
	vec32.BinaryScalar(vec32.Div, y, y, deviation)
	vec32.Binary(vec32.Mul, y, y, gain)
	vec32.Binary(vec32.Add, y, y, offset)
}

// centre sets c to the row x less its mean and returns the row's deviation √(Σc²·(1/n) + ε), as GoMLX's
// layer norm computes them; c may be x, t is scratch of the row's length.
func centre(c, x []float32, invN, epsilon float32, t []float32) (deviation float32) {
	mean := rowMean(x, invN)
	vec32.BinaryScalar(vec32.Sub, c, x, mean)
	vec32.Binary(vec32.Mul, t, c, c)
	return deviationOf(vec32.Sum(t), invN, epsilon)
}

// meanAndDeviation is centre's mean and deviation of a row that vec32's row passes take, without writing
// the centred values (the passes compute them again where they need them, to the same bits).
func meanAndDeviation(x []float32, invN, epsilon float32) (mean, deviation float32) {
	mean = rowMean(x, invN)
	return mean, deviationOf(vec32.SquaredDeviationsSum(x, mean), invN, epsilon)
}

// rowMean is Σx·(1/n), rounded to float32 as GoMLX's graph rounds it.
func rowMean(x []float32, invN float32) float32 { return float32(vec32.Sum(x) * invN) }

// deviationOf is √(sumSquares·(1/n) + ε), each operation rounded to float32 as GoMLX's graph rounds it.
func deviationOf(sumSquares, invN, epsilon float32) float32 {
	variance := float32(sumSquares * invN)
	return float32(math.Sqrt(float64(float32(variance + epsilon))))
}

// layerNormGradKernel is the gradient of a layer norm (layerNormKernel) with respect to its input, from the
// input x, the gain and the incoming gradient dy; layerNormProductKernel is dy times the normalised input
// (what the gain's gradient sums over the rows). Both recompute the row's centred values and deviation
// instead of reading the forward's, so that the forward runs as one row kernel in training too.
type layerNormGradKernel struct {
	layout   *rowLayout // scratch of four rows
	residual bool       // a fourth input, the input's gradient from elsewhere, is added in
	layerNormGradConstants
}

// layerNormGradConstants are the constants GoMLX's gradient graph holds, read from it.
type layerNormGradConstants struct {
	invN, epsilon float32 // the forward's
	one, half     float32 // 1/deviation and its half
	invNDeviation float32 // the 1/n that averages the squares' gradient
	invNMean      float32 // the 1/n that averages the mean's gradient
}

func (k *layerNormGradKernel) name() string { return "layer norm gradient" }

// deviationScale is the factor of the centred values in the input's gradient: dσ·((1/σ)·½)·(1/n).
func (k *layerNormGradConstants) deviationScale(dDeviation, deviation float32) float32 {
	return float32(float32(dDeviation*float32(float32(k.one/deviation)*k.half)) * k.invNDeviation)
}

func (k *layerNormGradKernel) run(backend *simplego.Backend, inputs []*simplego.Buffer, inputsOwned []bool) (*simplego.Buffer, error) {
	want := 3
	if k.residual {
		want++
	}
	if len(inputs) != want {
		return nil, fmt.Errorf("fusion: %s: %d inputs, want %d", k.name(), len(inputs), want)
	}
	// The incoming gradient's buffer (or the residual's) can take the result: each row of it is read before
	// its row is written.
	data, output, out, err := rowBuffers(backend, k.name(), k.layout.shape, inputs, inputsOwned, want-1)
	if err != nil {
		return nil, err
	}
	x, gain, dy := data[0].([]float32), data[1].([]float32), data[2].([]float32)
	var residual []float32
	if k.residual {
		residual = data[3].([]float32)
	}
	n := k.layout.n
	k.layout.splitRows(func(s *rowScratch, first, end int) {
		for r := first; r < end; r++ {
			lo, hi := r*n, (r+1)*n
			var rest []float32
			if residual != nil {
				rest = residual[lo:hi]
			}
			layerNormGradRow(out[lo:hi], x[lo:hi], gain, dy[lo:hi], rest, &k.layerNormGradConstants, s.row)
		}
	})
	return output, nil
}

// layerNormGradRow is GoMLX v0.26.0's gradient of layerNormRow with respect to x, plus residual (nil: none),
// operation for operation as its graph builds it (the same values on goaccel's executors); dx may be dy or
// residual, t is scratch of four rows.
//
//	g = dy·gain;  dσ = Σ −(g·(c/σ²));  k = dσ·((1/σ)·½)·(1/n)
//	a = g/σ + k·c + k·c;  dx = (residual + a) + (−Σa)·(1/n)
func layerNormGradRow(dx, x, gain, dy, residual []float32, k *layerNormGradConstants, t []float32) {
	if vec32.RowPasses(len(x)) {
		// The same operations as below, a pass per sum: nothing but dx is written.
		mean, deviation := meanAndDeviation(x, k.invN, k.epsilon)
		dDeviation := vec32.LayerNormDeviationGradSum(x, dy, gain, mean, float32(deviation*deviation))
		scale := k.deviationScale(dDeviation, deviation)
		shift := float32(-vec32.LayerNormGradSum(x, dy, gain, mean, deviation, scale) * k.invNMean)
		vec32.LayerNormGradOut(dx, x, dy, gain, residual, mean, deviation, scale, shift)
		return
	}
	layerNormGradRowCalls(dx, x, gain, dy, residual, k, t)
}

// layerNormGradRowCalls is layerNormGradRow one element-wise call per operation: rows of any length.
func layerNormGradRowCalls(dx, x, gain, dy, residual []float32, k *layerNormGradConstants, t []float32) {
	n := len(x)
	c, g, u, a := t[:n], t[n:2*n], t[2*n:3*n], t[3*n:4*n]
	deviation := centre(c, x, k.invN, k.epsilon, u)
	vec32.Binary(vec32.Mul, g, dy, gain)
	vec32.BinaryScalar(vec32.Div, u, c, float32(deviation*deviation))
	vec32.Binary(vec32.Mul, u, g, u)
	// GoMLX negates before it sums. Not the negated sum: a sum of zeros is +0 either way.
	vec32.Apply(vec32.Neg, u, u)
	dDeviation := vec32.Sum(u)
	scale := k.deviationScale(dDeviation, deviation)
	vec32.BinaryScalar(vec32.Div, a, g, deviation)
	vec32.BinaryScalar(vec32.Mul, u, c, scale)
	vec32.Binary(vec32.Add, a, a, u)
	vec32.Binary(vec32.Add, a, a, u)
	mean := float32(-vec32.Sum(a) * k.invNMean)
	if residual != nil {
		vec32.Binary(vec32.Add, dx, residual, a)
		vec32.BinaryScalar(vec32.Add, dx, dx, mean)
		return
	}
	vec32.BinaryScalar(vec32.Add, dx, a, mean)
}

// layerNormProductKernel is dy · (c/σ) of a layer norm's input x (see layerNormGradKernel). Inputs: x, dy.
type layerNormProductKernel struct {
	layout        *rowLayout // scratch of two rows
	invN, epsilon float32
}

func (k *layerNormProductKernel) name() string { return "layer norm gain's product" }

func (k *layerNormProductKernel) run(backend *simplego.Backend, inputs []*simplego.Buffer, inputsOwned []bool) (*simplego.Buffer, error) {
	if len(inputs) != 2 {
		return nil, fmt.Errorf("fusion: %s: %d inputs, want 2", k.name(), len(inputs))
	}
	data, output, out, err := rowBuffers(backend, k.name(), k.layout.shape, inputs, inputsOwned, 1)
	if err != nil {
		return nil, err
	}
	x, dy := data[0].([]float32), data[1].([]float32)
	n := k.layout.n
	k.layout.splitRows(func(s *rowScratch, first, end int) {
		for r := first; r < end; r++ {
			lo, hi := r*n, (r+1)*n
			layerNormProductRow(out[lo:hi], x[lo:hi], dy[lo:hi], k.invN, k.epsilon, s.row)
		}
	})
	return output, nil
}

// layerNormProductRow is dy · (c/σ) of one row x, as GoMLX's graph computes it; out may be dy, t is scratch
// of two rows.
func layerNormProductRow(out, x, dy []float32, invN, epsilon float32, t []float32) {
	if vec32.RowPasses(len(x)) {
		mean, deviation := meanAndDeviation(x, invN, epsilon)
		vec32.NormalizedProduct(out, x, dy, mean, deviation)
		return
	}
	n := len(x)
	c, u := t[:n], t[n:2*n]
	deviation := centre(c, x, invN, epsilon, u)
	vec32.BinaryScalar(vec32.Div, c, c, deviation)
	vec32.Binary(vec32.Mul, out, dy, c)
}

// unmasked is the length of mask row maskRow's leading unmasked run (prefixes' entry; negative: the row is
// not a leading run), or the whole row of n without a mask.
func unmasked(prefix []int32, maskRow, n int) int {
	if prefix == nil {
		return n
	}
	return int(prefix[maskRow])
}
