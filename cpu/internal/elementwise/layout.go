package elementwise

import (
	"reflect"

	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/shapes"

	"github.com/goaccel/goaccel/cpu/internal/blas"
	"github.com/goaccel/goaccel/cpu/internal/broadcast"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
)

// Transposes and explicit broadcasts move data without computing: simplego advances an index iterator per
// element; here the axes that stay adjacent move as blocks (attention's head splits and merges, layer
// norm's statistics broadcast back over the features).

var transposeCalls, broadcastInDimCalls atomicCounter

// execTranspose runs Transpose through the blas package's tiled, block-merging copy.
func execTranspose(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	permutation, ok := gomlxpatch.NodeData(node).([]int)
	shape, ok2 := gomlxpatch.NodeShape(node)
	if ok && ok2 && len(inputs) == 1 {
		if output, done := moveData(backend, inputs[0], shape, func(dst, src any, srcDims []int) bool {
			return withSameType(dst, src, func(d, s any) { transposeAny(d, s, srcDims, permutation) })
		}); done {
			transposeCalls.Add(1)
			return output, nil
		}
	}
	return fallbacks[opTypeTranspose](backend, node, inputs, inputsOwned)
}

// execBroadcastInDim runs BroadcastInDim as block copies and fills.
func execBroadcastInDim(backend *simplego.Backend, node *simplego.Node, inputs []*simplego.Buffer,
	inputsOwned []bool) (*simplego.Buffer, error) {
	broadcastAxes, ok := gomlxpatch.NodeData(node).([]int)
	shape, ok2 := gomlxpatch.NodeShape(node)
	if ok && ok2 && len(inputs) == 1 {
		if output, done := moveData(backend, inputs[0], shape, func(dst, src any, srcDims []int) bool {
			return withSameType(dst, src, func(d, s any) { broadcastAny(d, s, srcDims, shape.Dimensions, broadcastAxes) })
		}); done {
			broadcastInDimCalls.Add(1)
			return output, nil
		}
	}
	return fallbacks[opTypeBroadcastInDim](backend, node, inputs, inputsOwned)
}

// moveData allocates the output of shape and runs move on the flat data; done is false (and nothing
// allocated is kept) when a buffer cannot be read or move does not handle the dtype.
func moveData(backend *simplego.Backend, input *simplego.Buffer, shape shapes.Shape,
	move func(dst, src any, srcDims []int) bool) (*simplego.Buffer, bool) {
	inShape, err := backend.BufferShape(input)
	if err != nil || inShape.DType != shape.DType {
		return nil, false
	}
	output := backend.NewBuffer(shape)
	if output == nil {
		return nil, false
	}
	src, err1 := backend.BufferData(input)
	dst, err2 := backend.BufferData(output)
	if err1 != nil || err2 != nil || !move(dst, src, inShape.Dimensions) {
		_ = backend.BufferFinalize(output)
		return nil, false
	}
	return output, true
}

// withSameType calls fn when dst and src are slices of the same element type among those models use.
func withSameType(dst, src any, fn func(dst, src any)) bool {
	switch dst.(type) {
	case []float32, []float64, []int32, []int64, []bool, []uint8:
	default:
		return false
	}
	if reflect.TypeOf(dst) != reflect.TypeOf(src) {
		return false
	}
	fn(dst, src)
	return true
}

func transposeAny(dst, src any, srcDims, permutation []int) {
	switch d := dst.(type) {
	case []float32:
		blas.TransposeInto(d, src.([]float32), srcDims, permutation)
	case []float64:
		blas.TransposeInto(d, src.([]float64), srcDims, permutation)
	case []int32:
		blas.TransposeInto(d, src.([]int32), srcDims, permutation)
	case []int64:
		blas.TransposeInto(d, src.([]int64), srcDims, permutation)
	case []bool:
		blas.TransposeInto(d, src.([]bool), srcDims, permutation)
	case []uint8:
		blas.TransposeInto(d, src.([]uint8), srcDims, permutation)
	}
}

func broadcastAny(dst, src any, srcDims, dstDims, broadcastAxes []int) {
	switch d := dst.(type) {
	case []float32:
		broadcastInDim(d, src.([]float32), srcDims, dstDims, broadcastAxes)
	case []float64:
		broadcastInDim(d, src.([]float64), srcDims, dstDims, broadcastAxes)
	case []int32:
		broadcastInDim(d, src.([]int32), srcDims, dstDims, broadcastAxes)
	case []int64:
		broadcastInDim(d, src.([]int64), srcDims, dstDims, broadcastAxes)
	case []bool:
		broadcastInDim(d, src.([]bool), srcDims, dstDims, broadcastAxes)
	case []uint8:
		broadcastInDim(d, src.([]uint8), srcDims, dstDims, broadcastAxes)
	}
}

// broadcastInDim writes src, of dimensions srcDims whose axis i lands on output axis broadcastAxes[i],
// repeated over dst's dimensions. Output axes are merged where their source strides stay contiguous (or
// stay zero), so the innermost run is one copy or one fill.
func broadcastInDim[T any](dst, src []T, srcDims, dstDims, broadcastAxes []int) {
	rank := len(dstDims)
	srcStrideOf := make([]int, rank) // 0 on broadcast axes
	stride := 1
	for i := len(srcDims) - 1; i >= 0; i-- {
		if srcDims[i] != 1 {
			srcStrideOf[broadcastAxes[i]] = stride
		}
		stride *= srcDims[i]
	}
	var dims, strides []int // Merged, outermost first.
	for axis := range rank {
		if dstDims[axis] == 1 {
			continue
		}
		if n := len(dims) - 1; n >= 0 && strides[n] == srcStrideOf[axis]*dstDims[axis] {
			dims[n] *= dstDims[axis]
			strides[n] = srcStrideOf[axis]
			continue
		}
		dims, strides = append(dims, dstDims[axis]), append(strides, srcStrideOf[axis])
	}
	if len(dims) == 0 {
		dst[0] = src[0]
		return
	}
	inner, innerStride := dims[len(dims)-1], strides[len(dims)-1]
	outerDims, outerStrides := dims[:len(dims)-1], strides[:len(dims)-1]
	position := make([]int, len(outerDims))
	srcOffset := 0
	for at := 0; at < len(dst); at += inner {
		run := dst[at : at+inner]
		switch innerStride {
		case 0:
			broadcast.Fill(run, src[srcOffset])
		case 1:
			copy(run, src[srcOffset:srcOffset+inner])
		default:
			for i := range run {
				run[i] = src[srcOffset+i*innerStride]
			}
		}
		for axis := len(position) - 1; axis >= 0; axis-- {
			position[axis]++
			srcOffset += outerStrides[axis]
			if position[axis] < outerDims[axis] {
				break
			}
			srcOffset -= outerStrides[axis] * outerDims[axis]
			position[axis] = 0
		}
	}
}
