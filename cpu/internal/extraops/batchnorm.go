package extraops

import (
	"fmt"
	"math"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// Batch normalization, as XLA defines its three ops (https://openxla.org/xla/operation_semantics#batchnormtraining):
// with N the number of elements per feature, m and v a feature's mean and variance (biased, divided by N)
// and s = 1/√(v + ε),
//
//	BatchNormForTraining:  y = (x − m)·s·scale + offset, m and v the batch's own, returned with y
//	BatchNormForInference: the same with m and v given
//	BatchNormGradient:     ∂offset = Σ g, ∂scale = Σ g·(x − m)·s, ∂x = scale·s/N·(N·g − ∂offset − (x − m)·s·∂scale)
//
// where g is the gradient of y and the sums run over every axis but the feature axis. Each op with several
// results is built from single-output nodes (simplego's multi-output nodes have no executor table to
// patch): one statistics node computes both sums of a pass over the operand into a [2, features] result,
// which two slices hand out, and the element-wise result reads them: [m; v], then y; [∂offset; ∂scale],
// then ∂x. One pass for both statistics reads the operand (and g) once where a node per statistic read it
// twice. Sums accumulate in float64 (the vectorised float32 loops first in float32 lanes over a few
// chunks: batchnorm_f32.go).

// bnPart says which result of a batch normalization op a node computes.
type bnPart int

const (
	bnNormalized  bnPart = iota // y, from x, scale, offset, mean and variance
	bnStats                     // [m; v] (two rows of features), from x
	bnGradStats                 // [Σ g; Σ g·(x − m)·s], from x, mean, variance and g
	bnGradOperand               // ∂x, from x, scale, mean, variance, g, ∂scale and ∂offset
)

// bnParams is a batch normalization node's data.
type bnParams struct {
	part        bnPart
	epsilon     float32
	featureAxis int
}

// bnCheck validates a batch normalization's operand and its per-feature inputs, and returns the shape of
// one feature vector.
func (b *extendedBuilder) bnCheck(opType backends.OpType, featureAxis int, operand backends.Op,
	perFeature ...backends.Op) (features shapes.Shape, err error) {
	in, err := b.shapesOf(opType, append([]backends.Op{operand}, perFeature...)...)
	if err != nil {
		return shapes.Shape{}, err
	}
	shape := in[0]
	if !isFloat(shape.DType) {
		return shapes.Shape{}, fmt.Errorf("%s of %s: only float32 and float64 are implemented", opType, shape)
	}
	if featureAxis < 0 || featureAxis >= shape.Rank() {
		return shapes.Shape{}, fmt.Errorf("%s: feature axis %d out of range for operand %s", opType, featureAxis, shape)
	}
	features = shapes.Make(shape.DType, shape.Dimensions[featureAxis])
	for i, s := range in[1:] {
		if !s.Equal(features) {
			return shapes.Shape{}, fmt.Errorf("%s: input #%d is %s, expected %s (one value per feature of operand %s)",
				opType, i+1, s, features, shape)
		}
	}
	return features, nil
}

// BatchNormForInference implements backends.Builder.
func (b *extendedBuilder) BatchNormForInference(operand, scale, offset, mean, variance backends.Op, epsilon float32,
	featureAxis int) (backends.Op, error) {
	const opType = backends.OpTypeBatchNormForInference
	if _, err := b.bnCheck(opType, featureAxis, operand, scale, offset, mean, variance); err != nil {
		return nil, err
	}
	shape, _ := b.OpShape(operand)
	params := &bnParams{part: bnNormalized, epsilon: epsilon, featureAxis: featureAxis}
	return b.newNode(opType, shape.Clone(), params, operand, scale, offset, mean, variance)
}

// BatchNormForTraining implements backends.Builder.
func (b *extendedBuilder) BatchNormForTraining(operand, scale, offset backends.Op, epsilon float32,
	featureAxis int) (normalized, batchMean, batchVariance backends.Op, err error) {
	const opType = backends.OpTypeBatchNormForTraining
	features, err := b.bnCheck(opType, featureAxis, operand, scale, offset)
	if err != nil {
		return nil, nil, nil, err
	}
	shape, _ := b.OpShape(operand)
	part := func(part bnPart) *bnParams { return &bnParams{part: part, epsilon: epsilon, featureAxis: featureAxis} }
	stats, err := b.newNode(opType, shapes.Make(features.DType, 2, features.Dimensions[0]), part(bnStats), operand)
	if err != nil {
		return nil, nil, nil, err
	}
	if batchMean, batchVariance, err = b.bnRows(stats, features.Dimensions[0]); err != nil {
		return nil, nil, nil, err
	}
	normalized, err = b.newNode(opType, shape.Clone(), part(bnNormalized), operand, scale, offset, batchMean, batchVariance)
	if err != nil {
		return nil, nil, nil, err
	}
	return normalized, batchMean, batchVariance, nil
}

// bnRows returns the two rows of a [2, features] statistics node, each as a [features] vector.
func (b *extendedBuilder) bnRows(stats backends.Op, features int) (first, second backends.Op, err error) {
	row := func(i int) (backends.Op, error) {
		sliced, err := b.Slice(stats, []int{i, 0}, []int{i + 1, features}, []int{1, 1})
		if err != nil {
			return nil, err
		}
		return b.Reshape(sliced, features)
	}
	if first, err = row(0); err != nil {
		return nil, nil, err
	}
	if second, err = row(1); err != nil {
		return nil, nil, err
	}
	return first, second, nil
}

// BatchNormGradient implements backends.Builder.
func (b *extendedBuilder) BatchNormGradient(operand, scale, mean, variance, gradOutput backends.Op, epsilon float32,
	featureAxis int) (gradOperand, gradScale, gradOffset backends.Op, err error) {
	const opType = backends.OpTypeBatchNormGradient
	features, err := b.bnCheck(opType, featureAxis, operand, scale, mean, variance)
	if err != nil {
		return nil, nil, nil, err
	}
	shape, _ := b.OpShape(operand)
	if gradShape, err := b.OpShape(gradOutput); err != nil || !gradShape.Equal(shape) {
		return nil, nil, nil, fmt.Errorf("%s: gradient of the output %s does not match operand %s (%v)", opType,
			gradShape, shape, err)
	}
	part := func(part bnPart) *bnParams { return &bnParams{part: part, epsilon: epsilon, featureAxis: featureAxis} }
	stats, err := b.newNode(opType, shapes.Make(features.DType, 2, features.Dimensions[0]), part(bnGradStats),
		operand, mean, variance, gradOutput)
	if err != nil {
		return nil, nil, nil, err
	}
	if gradOffset, gradScale, err = b.bnRows(stats, features.Dimensions[0]); err != nil {
		return nil, nil, nil, err
	}
	gradOperand, err = b.newNode(opType, shape.Clone(), part(bnGradOperand), operand, scale, mean, variance,
		gradOutput, gradScale, gradOffset)
	if err != nil {
		return nil, nil, nil, err
	}
	return gradOperand, gradScale, gradOffset, nil
}

// bnInputs is the number of inputs of each part's node.
var bnInputs = map[bnPart]int{bnNormalized: 5, bnStats: 1, bnGradStats: 4, bnGradOperand: 7}

// execBatchNorm runs every batch normalization node: the three op types share it, the part in the node's
// data saying what to compute.
func execBatchNorm(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer, _ []bool) (
	*simplego.Buffer, error) {
	params, ok := nodeData[*bnParams](node)
	if !ok || len(inputs) != bnInputs[params.part] {
		return nil, fmt.Errorf("extraops: batch normalization node without its parameters (not built by extraops' builder)")
	}
	operandShape, err := backend.BufferShape(inputs[0])
	if err != nil {
		return nil, err
	}
	output, flats, err := outputAndData(backend, node, inputs)
	if err != nil {
		return nil, err
	}
	l := newBNLayout(operandShape.Dimensions, params.featureAxis)
	epsilon := float64(params.epsilon)
	switch out := flats[0].(type) {
	case []float32:
		err = runBatchNorm(params.part, l, epsilon, out, flats[1:])
	case []float64:
		err = runBatchNorm(params.part, l, epsilon, out, flats[1:])
	default:
		err = fmt.Errorf("extraops: batch normalization of %T: only float32 and float64 are implemented", flats[0])
	}
	if err != nil {
		_ = backend.BufferFinalize(output)
		return nil, err
	}
	batchNormCalls.Add(1)
	return output, nil
}

// bnLayout views an operand as [outer, features, inner], the feature axis in the middle.
type bnLayout struct{ outer, features, inner int }

func newBNLayout(dims []int, featureAxis int) bnLayout {
	l := bnLayout{outer: 1, features: dims[featureAxis], inner: 1}
	for _, d := range dims[:featureAxis] {
		l.outer *= d
	}
	for _, d := range dims[featureAxis+1:] {
		l.inner *= d
	}
	return l
}

// perFeature is the number of elements each feature's statistics are over.
func (l bnLayout) perFeature() int { return l.outer * l.inner }

// forEachRow calls fn with each contiguous run of one feature's elements: its feature and its offset.
func (l bnLayout) forEachRow(fn func(feature, offset int)) {
	offset := 0
	for range l.outer {
		for c := range l.features {
			fn(c, offset)
			offset += l.inner
		}
	}
}

// runBatchNorm computes one part into out from the node's inputs (flat data, in the order of bnInputs).
func runBatchNorm[T float32 | float64](part bnPart, l bnLayout, epsilon float64, out []T, in []any) error {
	args := make([][]T, len(in))
	for i, flat := range in {
		var ok bool
		if args[i], ok = flat.([]T); !ok {
			return fmt.Errorf("extraops: batch normalization input #%d is %T, not %T", i, flat, out)
		}
	}
	n := float64(l.perFeature())
	if l.inner == 1 && channelsLastLoops {
		// Channels last (a convolution's [batch, h, w, c]): each feature's elements are one apart, so the
		// row walk below would call its closure once per element. These loops take a whole row of
		// features at a time instead, with the same float64 operations in the same order: the same bits.
		// float32 tensors take the vectorised loops (batchnorm_f32.go) instead.
		if out32, ok := any(out).([]float32); ok && vectorisedFloat32 && l.outer > 0 && l.features > 0 {
			return runBatchNormChannelsLast32(part, l, epsilon, n, out32, any(args).([][]float32))
		}
		return runBatchNormChannelsLast(part, l, epsilon, n, out, args)
	}
	features := l.features
	switch part {
	case bnStats: // the mean, then the variance about it (as rounded to T) in a second pass
		for c, sum := range bnSums(l, args[0], func(x T, _ int) float64 { return float64(x) }) {
			out[c] = T(sum / n)
		}
		mean := out[:features]
		sums := bnSums(l, args[0], func(x T, c int) float64 { d := float64(x) - float64(mean[c]); return float64(d * d) })
		for c, sum := range sums {
			out[features+c] = T(sum / n)
		}
	case bnNormalized:
		x, scale, offset, mean, variance := args[0], args[1], args[2], args[3], args[4]
		factor := make([]float64, l.features)
		for c := range factor {
			factor[c] = float64(scale[c]) / math.Sqrt(float64(variance[c])+epsilon)
		}
		l.forEachRow(func(c, offset0 int) {
			m, f, o := float64(mean[c]), factor[c], float64(offset[c])
			for i := offset0; i < offset0+l.inner; i++ {
				out[i] = T(float64((float64(x[i])-m)*f) + o)
			}
		})
	case bnGradStats:
		x, mean, variance, g := args[0], args[1], args[2], args[3]
		for c, sum := range bnSums(l, g, func(g T, _ int) float64 { return float64(g) }) {
			out[c] = T(sum)
		}
		sums := make([]float64, features)
		l.forEachRow(func(c, offset int) {
			m, sum := float64(mean[c]), 0.0
			for i := offset; i < offset+l.inner; i++ {
				sum += float64(float64(g[i]) * (float64(x[i]) - m))
			}
			sums[c] += sum
		})
		for c, sum := range sums {
			out[features+c] = T(sum / math.Sqrt(float64(variance[c])+epsilon))
		}
	case bnGradOperand:
		x, scale, mean, variance, g, gradScale, gradOffset := args[0], args[1], args[2], args[3], args[4], args[5], args[6]
		l.forEachRow(func(c, offset int) {
			s := 1 / math.Sqrt(float64(variance[c])+epsilon)
			k, m := float64(scale[c])*s/n, float64(mean[c])
			sumG, sumGX := float64(gradOffset[c]), float64(gradScale[c])*s
			for i := offset; i < offset+l.inner; i++ {
				out[i] = T(k * (float64(n*float64(g[i])) - sumG - float64((float64(x[i])-m)*sumGX)))
			}
		})
	default:
		return errUnknownBNPart(part)
	}
	return nil
}

// bnSums returns, per feature, the float64 sum of term over that feature's elements of x.
func bnSums[T float32 | float64](l bnLayout, x []T, term func(x T, feature int) float64) []float64 {
	sums := make([]float64, l.features)
	l.forEachRow(func(c, offset int) {
		sum := 0.0
		for _, v := range x[offset : offset+l.inner] {
			sum += term(v, c)
		}
		sums[c] += sum
	})
	return sums
}

// channelsLastLoops turns runBatchNormChannelsLast on (tests compare it with the row walk, bit for bit).
var channelsLastLoops = true

// vectorisedFloat32 turns runBatchNormChannelsLast32 on for float32 (tests compare it with the float64 loops).
var vectorisedFloat32 = true

func errUnknownBNPart(part bnPart) error {
	return fmt.Errorf("extraops: unknown batch normalization part %d", part)
}

// runBatchNormChannelsLast is runBatchNorm for a layout whose feature axis is the innermost (inner == 1):
// row o holds the features of outer index o, contiguous. Both paths round every product before adding it
// (an explicit float64 conversion), so no GOAMD64 level fuses one path's multiply-adds and not the other's.
func runBatchNormChannelsLast[T float32 | float64](part bnPart, l bnLayout, epsilon, n float64, out []T, args [][]T) error {
	features := l.features
	perFeature := func(v []T) []float64 {
		f := make([]float64, features)
		for c := range f {
			f[c] = float64(v[c])
		}
		return f
	}
	rows := func(x []T, fn func(row []T, o int)) {
		for o := range l.outer {
			fn(x[o*features:(o+1)*features], o)
		}
	}
	sums := make([]float64, features)
	switch part {
	case bnStats:
		rows(args[0], func(row []T, _ int) {
			for c, v := range row {
				sums[c] += float64(v)
			}
		})
		for c, sum := range sums {
			out[c] = T(sum / n)
		}
		mean := perFeature(out[:features])
		clear(sums)
		rows(args[0], func(row []T, _ int) {
			for c, v := range row {
				d := float64(v) - mean[c]
				sums[c] += float64(d * d)
			}
		})
		for c, sum := range sums {
			out[features+c] = T(sum / n)
		}
	case bnNormalized:
		x, scale, offset, mean, variance := args[0], args[1], args[2], perFeature(args[3]), args[4]
		factor, shift := make([]float64, features), perFeature(offset)
		for c := range factor {
			factor[c] = float64(scale[c]) / math.Sqrt(float64(variance[c])+epsilon)
		}
		rows(x, func(row []T, o int) {
			dst := out[o*features : (o+1)*features]
			for c, v := range row {
				dst[c] = T(float64((float64(v)-mean[c])*factor[c]) + shift[c])
			}
		})
	case bnGradStats:
		x, mean, variance, g := args[0], perFeature(args[1]), args[2], args[3]
		products := make([]float64, features)
		rows(x, func(row []T, o int) {
			grad := g[o*features : (o+1)*features]
			for c, v := range row {
				sums[c] += float64(grad[c])
				products[c] += float64(float64(grad[c]) * (float64(v) - mean[c]))
			}
		})
		for c := range features {
			out[c] = T(sums[c])
			out[features+c] = T(products[c] / math.Sqrt(float64(variance[c])+epsilon))
		}
	case bnGradOperand:
		x, scale, mean, variance, g, gradScale, gradOffset := args[0], args[1], perFeature(args[2]), args[3], args[4], args[5], args[6]
		k, sumG, sumGX := make([]float64, features), perFeature(gradOffset), make([]float64, features)
		for c := range k {
			s := 1 / math.Sqrt(float64(variance[c])+epsilon)
			k[c], sumGX[c] = float64(scale[c])*s/n, float64(gradScale[c])*s
		}
		rows(x, func(row []T, o int) {
			grad, dst := g[o*features:(o+1)*features], out[o*features:(o+1)*features]
			for c, v := range row {
				dst[c] = T(k[c] * (float64(n*float64(grad[c])) - sumG[c] - float64((float64(v)-mean[c])*sumGX[c])))
			}
		})
	default:
		return errUnknownBNPart(part)
	}
	return nil
}
