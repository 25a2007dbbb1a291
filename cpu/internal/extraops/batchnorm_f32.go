package extraops

import (
	"math"

	"github.com/goaccel/goaccel/cpu/internal/threads"
	"github.com/goaccel/goaccel/internal/vec32"
)

// Channels-last batch normalization in float32 (a convolution's [batch, h, w, c] activations, the case a
// ResNet spends its batch-norm time in): each part is one vec32 pass (AddShiftedMoments for both forward
// statistics, AddGradientMoments for both gradient sums, ScaleDeviations, CombineDeviations) over chunks of whole rows of features, against the per-feature
// values tiled to a chunk's length, so that the AVX2 kernels do the arithmetic and the partial sums stay
// in the first-level cache. The float64 loops of runBatchNormChannelsLast convert every element and are
// not vectorised; these are several times faster (BenchmarkBatchNormChannelsLast) and split the rows over
// the process's compute threads.
//
// Precision: element-wise arithmetic is float32, as in the rest of a float32 graph. Sums accumulate in
// float32 lanes over at most bnFlushChunks chunks, then in float64; the sums run over fixed segments of
// rows combined in order, so a result does not depend on how many threads computed it.

const (
	// bnChunkElements is about how many elements one chunk holds: whole rows of features.
	bnChunkElements = 1024
	// bnFlushChunks is how many chunks a float32 partial sum covers before it is added into float64: a
	// segment of rows. Each lane then adds at most this many values in float32.
	bnFlushChunks = 16
	// bnParallelElements is the size below which one thread does the whole tensor: the hand-over to a
	// worker (threads.Split) costs more than it saves on less.
	bnParallelElements = 1 << 14
)

// bnChunks describes how a channels-last tensor of rows × features is cut: chunks of chunkRows rows, and
// segments of segmentRows rows (bnFlushChunks chunks) whose sums are kept apart.
type bnChunks struct {
	rows, features, chunkRows, segmentRows int
}

func newBNChunks(l bnLayout) bnChunks {
	chunkRows := max(1, bnChunkElements/l.features)
	return bnChunks{rows: l.outer, features: l.features, chunkRows: chunkRows, segmentRows: chunkRows * bnFlushChunks}
}

func (c bnChunks) segments() int { return (c.rows + c.segmentRows - 1) / c.segmentRows }

// firstChunkMean returns, per feature, the mean of the first chunk's rows of x.
func (c bnChunks) firstChunkMean(x []float32) []float32 {
	rows := min(c.rows, c.chunkRows)
	sums := make([]float64, c.features)
	for r := range rows {
		for f, v := range x[r*c.features : (r+1)*c.features] {
			sums[f] += float64(v)
		}
	}
	mean := make([]float32, c.features)
	for f, sum := range sums {
		mean[f] = float32(sum / float64(rows))
	}
	return mean
}

// tile returns v (one value per feature) repeated chunkRows times.
func (c bnChunks) tile(v []float32) []float32 {
	t := make([]float32, c.chunkRows*c.features)
	for r := range c.chunkRows {
		copy(t[r*c.features:], v)
	}
	return t
}

// tile64 is tile of float64 values rounded to float32.
func (c bnChunks) tile64(v []float64) []float32 {
	v32 := make([]float32, len(v))
	for i, x := range v {
		v32[i] = float32(x)
	}
	return c.tile(v32)
}

// forSegments calls fn for every segment, from a few goroutines when the tensor is large: fn gets the
// segment's index and its first and end rows.
func (c bnChunks) forSegments(fn func(segment, first, end int)) {
	segments := c.segments()
	workers := min(threads.Budget(), segments)
	if c.rows*c.features < bnParallelElements {
		workers = 1
	}
	run := func(w int) {
		for s := segments * w / workers; s < segments*(w+1)/workers; s++ {
			fn(s, s*c.segmentRows, min(c.rows, (s+1)*c.segmentRows))
		}
	}
	if workers <= 1 {
		run(0)
		return
	}
	threads.Split(workers, run)
}

// forChunks calls fn with each chunk of rows first..end as the element range [from, to).
func (c bnChunks) forChunks(first, end int, fn func(from, to int)) {
	for r := first; r < end; r += c.chunkRows {
		fn(r*c.features, min(end, r+c.chunkRows)*c.features)
	}
}

// featureSums returns, per feature, the sums over every row of the two values accumulate adds for each
// chunk [from, to) into first and second (each to−from long: float32 partial sums kept per position of a
// chunk).
func (c bnChunks) featureSums(accumulate func(from, to int, first, second []float32)) (firstSums, secondSums []float64) {
	chunk := c.chunkRows * c.features
	segmentSums := make([]float64, 2*c.segments()*c.features)
	c.forSegments(func(segment, first, end int) {
		acc := make([]float32, 2*chunk)
		c.forChunks(first, end, func(from, to int) { accumulate(from, to, acc[:to-from], acc[chunk:chunk+to-from]) })
		sums := segmentSums[2*segment*c.features : 2*(segment+1)*c.features]
		for r := range 2 * c.chunkRows { // the first accumulator's rows, then the second's
			into := sums[(r/c.chunkRows)*c.features:]
			for f, v := range acc[r*c.features : (r+1)*c.features] {
				into[f] += float64(v)
			}
		}
	})
	firstSums, secondSums = make([]float64, c.features), make([]float64, c.features)
	for s := range c.segments() {
		for f := range c.features {
			firstSums[f] += segmentSums[(2*s)*c.features+f]
			secondSums[f] += segmentSums[(2*s+1)*c.features+f]
		}
	}
	return firstSums, secondSums
}

// forEachChunk calls fn for every chunk of the tensor, the rows split over the compute threads.
func (c bnChunks) forEachChunk(fn func(from, to int)) {
	c.forSegments(func(_, first, end int) { c.forChunks(first, end, fn) })
}

// runBatchNormChannelsLast32 is runBatchNormChannelsLast for float32 operands.
func runBatchNormChannelsLast32(part bnPart, l bnLayout, epsilon, n float64, out []float32, args [][]float32) error {
	c := newBNChunks(l)
	switch part {
	case bnStats:
		// One pass: the sums of d = x − shift and of d², shift being the mean of the first chunk's rows (near
		// the batch mean, so that the variance E[d²] − E[d]² does not cancel away float32's digits, which a
		// single outlying row as the shift would).
		x := args[0]
		shift := c.tile(c.firstChunkMean(x))
		sums, squares := c.featureSums(func(from, to int, sum, square []float32) {
			vec32.AddShiftedMoments(sum, square, x[from:to], shift)
		})
		for f := range c.features {
			mean := sums[f] / n
			out[f] = float32(float64(shift[f]) + mean)
			out[c.features+f] = float32(max(0, squares[f]/n-mean*mean))
		}
	case bnNormalized:
		x, scale, offset, variance := args[0], args[1], args[2], args[4]
		factor := make([]float32, c.features)
		for f := range factor {
			factor[f] = float32(float64(scale[f]) / math.Sqrt(float64(variance[f])+epsilon))
		}
		mean, factorT, offsetT := c.tile(args[3]), c.tile(factor), c.tile(offset)
		c.forEachChunk(func(from, to int) { vec32.ScaleDeviations(out[from:to], x[from:to], mean, factorT, offsetT) })
	case bnGradStats:
		x, mean, variance, g := args[0], c.tile(args[1]), args[2], args[3]
		sums, products := c.featureSums(func(from, to int, sum, product []float32) {
			vec32.AddGradientMoments(sum, product, g[from:to], x[from:to], mean)
		})
		for f := range c.features {
			out[f] = float32(sums[f])
			out[c.features+f] = float32(products[f] / math.Sqrt(float64(variance[f])+epsilon))
		}
	case bnGradOperand:
		// ∂x = k·(N·g − ∂offset − (x − m)·s·∂scale) with k = scale·s/N, as a·g + b·(x − m) + d per feature.
		x, scale, variance, g, gradScale, gradOffset := args[0], args[1], args[3], args[4], args[5], args[6]
		a, b, d := make([]float64, c.features), make([]float64, c.features), make([]float64, c.features)
		for f := range a {
			s := 1 / math.Sqrt(float64(variance[f])+epsilon)
			k := float64(scale[f]) * s / n
			a[f], b[f], d[f] = k*n, -k*float64(gradScale[f])*s, -k*float64(gradOffset[f])
		}
		mean, aT, bT, dT := c.tile(args[2]), c.tile64(a), c.tile64(b), c.tile64(d)
		c.forEachChunk(func(from, to int) {
			vec32.CombineDeviations(out[from:to], g[from:to], x[from:to], mean, aT, bT, dT)
		})
	default:
		return errUnknownBNPart(part)
	}
	return nil
}
