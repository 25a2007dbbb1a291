package convkernel

import (
	"sync"

	"github.com/goaccel/goaccel/cpu/internal/gemmtile"
	"github.com/goaccel/goaccel/cpu/internal/threads"
)

// A float32 convolution of up to two spatial axes runs directly on gemmtile's kernel where that kernel runs
// (amd64 with AVX2 and FMA): the product of the patches with the kernel is an implicit gemm whose rows are
// output positions and whose contraction walks the kernel window and the input channels, each element read
// from the (zero-padded) input through a table of offsets. Neither the im2col matrix (as many elements as
// the gemm reads) nor OpenBLAS's packing of it (as long as the gemm itself for these tall, narrow products)
// is written. The kernel gradient of a channels-last convolution (the dual plan) is the same product with
// the roles exchanged: rows are kernel positions and input channels, the contraction walks the batch and
// the output positions.

// canRunDirect reports whether plan runs on gemmtile: float32 (the caller checks), up to two spatial axes,
// no input dilation or negative padding, and offsets that fit its int32 table.
func canRunDirect(p *convPlan) bool {
	if !gemmtile.Accelerated() || p.numSpatial() > 2 {
		return false
	}
	for i := range p.inputDilations {
		if p.inputDilations[i] != 1 || p.lowPads[i] < 0 {
			return false
		}
	}
	return p.batch*product(p.inputSpatial)*p.inChannels < 1<<31
}

// window is a plan's two spatial axes (one spatial axis is a unit first axis) and the padded input they
// read: input position o·stride + k·dilation along each axis of the padded input, of height × width.
type window struct {
	height, width        int // padded input
	padTop, padLeft      int
	inHeight, inWidth    int // input
	outHeight, outWidth  int
	kHeight, kWidth      int
	strideH, strideW     int
	dilationH, dilationW int
	needsPadding         bool
}

func windowOf(p *convPlan) window {
	at := func(values []int, i, unit int) int {
		if len(values) == 1 {
			if i == 0 {
				return unit
			}
			return values[0]
		}
		return values[i]
	}
	w := window{
		inHeight: at(p.inputSpatial, 0, 1), inWidth: at(p.inputSpatial, 1, 1),
		outHeight: at(p.outputSpatial, 0, 1), outWidth: at(p.outputSpatial, 1, 1),
		kHeight: at(p.kernelSpatial, 0, 1), kWidth: at(p.kernelSpatial, 1, 1),
		strideH: at(p.strides, 0, 1), strideW: at(p.strides, 1, 1),
		dilationH: at(p.kernelDilations, 0, 1), dilationW: at(p.kernelDilations, 1, 1),
		padTop: at(p.lowPads, 0, 0), padLeft: at(p.lowPads, 1, 0),
	}
	// The padded input must hold the last position the window reads.
	lastH := (w.outHeight-1)*w.strideH + (w.kHeight-1)*w.dilationH + 1
	lastW := (w.outWidth-1)*w.strideW + (w.kWidth-1)*w.dilationW + 1
	w.height = max(lastH, w.padTop+w.inHeight)
	w.width = max(lastW, w.padLeft+w.inWidth)
	w.needsPadding = w.height != w.inHeight || w.width != w.inWidth
	return w
}

// parallelPadElements is the padded size from which padding is split over the compute threads
// (threads.Split).
const parallelPadElements = 1 << 14

// padded returns input ([outer][inHeight][inWidth][channels]) inside a zero border as the window reads it,
// or input itself when there is no border.
func (w window) padded(input []float32, outer, channels int, pool *scratchPool[float32]) (padded []float32, release func()) {
	if !w.needsPadding {
		return input, func() {}
	}
	padded = pool.get(outer * w.height * w.width * channels)
	// Each plane is written whole (its border cleared, its rows copied) by one goroutine; large inputs are
	// split over the compute threads by planes, as the product after it is split by rows.
	line, plane := w.inWidth*channels, w.height*w.width*channels
	fill := func(first, end int) {
		for o := first; o < end; o++ {
			dst := padded[o*plane : (o+1)*plane]
			top := (w.padTop*w.width + w.padLeft) * channels
			clear(dst[:top])
			for h := range w.inHeight {
				from := (o*w.inHeight + h) * line
				to := ((w.padTop+h)*w.width + w.padLeft) * channels
				copy(dst[to:to+line], input[from:from+line])
				next := len(dst)
				if h+1 < w.inHeight {
					next = ((w.padTop+h+1)*w.width + w.padLeft) * channels
				}
				clear(dst[to+line : next])
			}
		}
	}
	workers := min(threads.Budget(), outer)
	if len(padded) < parallelPadElements {
		workers = 1
	}
	if workers <= 1 {
		fill(0, outer)
	} else {
		threads.Split(workers, func(worker int) { fill(outer*worker/workers, outer*(worker+1)/workers) })
	}
	return padded, func() { pool.put(padded) }
}

// convolveDirect computes a convolution whose operands are in canonical order (convolve moves them there):
// rows are the output positions (batch, y, x), the contraction the window (ky, kx, input channel).
func convolveDirect(p *convPlan, input, kernel, output []float32, pool *scratchPool[float32]) {
	w := windowOf(p)
	channels := p.inChannels
	a, release := w.padded(input, p.batch, channels, pool)
	defer release()
	t := cachedTables(tableKey{w: w, outer: p.batch, depth: channels}, func() gemmTables {
		var t gemmTables
		for n := range p.batch {
			for y := range w.outHeight {
				for x := range w.outWidth {
					t.rowStarts = append(t.rowStarts, ((n*w.height+y*w.strideH)*w.width+x*w.strideW)*channels)
				}
			}
		}
		for ky := range w.kHeight {
			for kx := range w.kWidth {
				for c := range channels {
					t.offsets = append(t.offsets, int32((ky*w.dilationH*w.width+kx*w.dilationW)*channels+c))
				}
			}
		}
		return t
	})
	gemmtile.Product{A: a, RowStarts: t.rowStarts, Offsets: t.offsets, B: kernel, LDB: p.outChannels,
		N: p.outChannels, C: output, LDC: p.outChannels, Reach: t.reach}.Run(threads.Budget())
	directConvCalls.Add(1)
}

// convolveDirectDual computes a dual plan (the kernel gradient of a channels-last convolution): its input
// is stored [inChannels, spatial..., batch] — the forward convolution's input, whose batch is the
// contraction here and whose channels are the rows — and its kernel [inChannels, spatial..., out], the
// forward output's gradient. Rows are (output y, output x, batch item), the contraction (input channel,
// kernel y, kernel x), so that the result lands in the output's layout [spatial..., batch, out].
func convolveDirectDual(p *convPlan, input, kernel, output []float32, pool *scratchPool[float32]) {
	w := windowOf(p)
	depth := p.batch // innermost axis of the stored input
	a, release := w.padded(input, p.inChannels, depth, pool)
	defer release()
	t := cachedTables(tableKey{dual: true, w: w, outer: p.inChannels, depth: depth}, func() gemmTables {
		var t gemmTables
		for y := range w.outHeight {
			for x := range w.outWidth {
				for b := range depth {
					t.rowStarts = append(t.rowStarts, (y*w.strideH*w.width+x*w.strideW)*depth+b)
				}
			}
		}
		for c := range p.inChannels {
			for ky := range w.kHeight {
				for kx := range w.kWidth {
					t.offsets = append(t.offsets, int32(((c*w.height+ky*w.dilationH)*w.width+kx*w.dilationW)*depth))
				}
			}
		}
		return t
	})
	gemmtile.Product{A: a, RowStarts: t.rowStarts, Offsets: t.offsets, B: kernel, LDB: p.outChannels,
		N: p.outChannels, C: output, LDC: p.outChannels, Reach: t.reach}.Run(threads.Budget())
	directConvCalls.Add(1)
}

// gemmTables are an implicit gemm's row starts and contraction offsets, which depend only on the
// convolution's geometry: built once per geometry (a model has a few, a training step runs each many times).
type gemmTables struct {
	rowStarts []int
	offsets   []int32
	reach     *gemmtile.Reach
}

// tableKey is a convolution's geometry: its window over the padded input, the number of [height, width,
// depth] blocks of that input (outer), their depth, and whether it is a dual plan.
type tableKey struct {
	dual         bool
	w            window
	outer, depth int
}

// maxCachedTables bounds the cache: past it (a program convolving ever new shapes), it starts over.
const maxCachedTables = 64

var (
	tablesMu sync.Mutex
	tables   = map[tableKey]gemmTables{}
)

// cachedTables returns the tables of key, built by build the first time.
func cachedTables(key tableKey, build func() gemmTables) gemmTables {
	tablesMu.Lock()
	defer tablesMu.Unlock()
	if t, ok := tables[key]; ok {
		return t
	}
	if len(tables) >= maxCachedTables {
		clear(tables)
	}
	t := build()
	reach := gemmtile.ReachOf(t.rowStarts, t.offsets)
	t.reach = &reach
	tables[key] = t
	return t
}
