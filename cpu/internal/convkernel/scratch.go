package convkernel

import (
	"cmp"
	"slices"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// Conv is one ConvGeneral of a graph, its operands' shapes and its parameters: what ScratchBuffers needs to
// tell the memory the executor will take besides the node's output.
type Conv struct {
	Input, Kernel, Output              shapes.Shape
	Axes                               backends.ConvolveAxesConfig
	Strides                            []int
	Paddings                           [][2]int
	InputDilations, KernelDilations    []int
	ChannelGroupCount, BatchGroupCount int
}

// ScratchBuffers returns the bytes of each buffer the ConvGeneral executor takes from its scratch pool to
// run c, in the order it takes them, as convolve chooses its path: canonical copies of operands not in
// canonical order, the padded input of a direct product, the patches of an im2col product, a product in
// canonical order before its transpose. None for a convolution simplego's own executor runs (grouped, or
// a dtype other than float32 and float64).
func ScratchBuffers(c Conv) []int64 {
	if c.Input.DType != dtypes.Float32 && c.Input.DType != dtypes.Float64 {
		return nil
	}
	plan, ok, err := newConvPlan(c.Input, c.Kernel, &convParams{axes: c.Axes, strides: c.Strides,
		paddings: c.Paddings, inputDilations: c.InputDilations, kernelDilations: c.KernelDilations,
		channelGroupCount: c.ChannelGroupCount, batchGroupCount: c.BatchGroupCount})
	if err != nil || !ok {
		return nil
	}
	direct := c.Input.DType == dtypes.Float32 && canRunDirect(plan)
	elements := scratchElements(plan, direct, c.Input.Size(), c.Kernel.Size(), c.Output.Size())
	size := int64(c.Input.DType.Size())
	bytes := make([]int64, len(elements))
	for i, n := range elements {
		bytes[i] = int64(n) * size
	}
	return bytes
}

// scratchElements mirrors convolve's calls of pool.get for plan p: keep the two in step.
func scratchElements(p *convPlan, direct bool, inputLen, kernelLen, outputLen int) []int {
	var sizes []int
	padded := func(outer, depth int) {
		if w := windowOf(p); w.needsPadding {
			sizes = append(sizes, outer*w.height*w.width*depth)
		}
	}
	if p.dual && direct {
		padded(p.inChannels, p.batch)
		return sizes
	}
	if p.dual {
		return append(sizes, p.rows()*p.patchLength())
	}
	if p.inputPerm != nil {
		sizes = append(sizes, inputLen)
	}
	if p.kernelPerm != nil {
		sizes = append(sizes, kernelLen)
	}
	if direct {
		if p.outputPerm != nil {
			sizes = append(sizes, outputLen)
		}
		padded(p.batch, p.inChannels)
		return sizes
	}
	if !p.isPointwise() {
		sizes = append(sizes, p.rows()*p.patchLength())
	}
	if p.outputPerm != nil {
		sizes = append(sizes, outputLen)
	}
	return sizes
}

// PooledBytes is the most memory the scratch pool holds over a step whose convolutions take buffers: the
// pool keeps up to maxPooledScratch freed buffers for the next convolution, so the largest ones stay
// allocated for the life of the process.
func PooledBytes(buffers []int64) int64 {
	sorted := slices.Clone(buffers)
	slices.SortFunc(sorted, func(a, b int64) int { return cmp.Compare(b, a) })
	var total int64
	for _, b := range sorted[:min(len(sorted), maxPooledScratch)] {
		total += b
	}
	return total
}
