package main

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	. "github.com/gomlx/gomlx/pkg/core/graph" //nolint:revive // GoMLX graph code reads best with the dot import.
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/context/initializers"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/layers/batchnorm"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/datasets/fashionmnist"
)

// arch is the network's shape.
type arch struct {
	// width is the channels of the first stage; the second stage has twice as many.
	width int
	// blocks is the number of residual blocks per stage.
	blocks int
	// dropout is the rate of the dropout before the dense head.
	dropout float64
}

// Fashion-MNIST's training-pixel statistics (pixels scaled to [0, 1]), which the model standardises its
// inputs with, as the grad_accum demo does.
const (
	pixelMean = 0.2860
	pixelStd  = 0.3530
)

// Batch normalization as PyTorch's BatchNorm2d defaults set it, so that the PyTorch twin
// (internal/bench/pytorch/resnet_ddp.py) is the same model: GoMLX's defaults are Keras's (momentum 0.99,
// ε = 10⁻³). GoMLX's momentum is the old average's weight, PyTorch's (0.1) the new batch's.
const (
	bnMomentum = 0.9
	bnEpsilon  = 1e-5
)

// resnet returns the model function: a small ResNet for 28×28 grey images, channels last.
//
//	stem:    3×3 conv (width) – BN – ReLU – 2×2 max pool            28×28 → 14×14
//	stage 1: blocks × basic block (width), identity shortcuts       14×14
//	stage 2: basic block (2·width, stride 2, 1×1 projection         14×14 → 7×7
//	         shortcut), then blocks − 1 basic blocks (2·width)
//	head:    global average pooling – dropout – dense → 10 logits
//
// A basic block is conv 3×3 – BN – ReLU – conv 3×3 – BN, added to its shortcut, then ReLU. Convolutions
// have no bias (the batch normalization after each has an offset) and He-normal kernels; the head's
// weights are Xavier-uniform, its biases zero.
func resnet(a arch) accel.ModelFn {
	return func(ctx *context.Context, inputs []*Node) []*Node {
		he := ctx.WithInitializer(initializers.HeFn(ctx))
		x := Reshape(standardise(inputs[0]), -1, fashionmnist.Height, fashionmnist.Width, 1)
		x = activations.Relu(convBN(he.In("stem"), x, a.width, 3, 1))
		x = MaxPool(x).Window(2).Done()
		for stage, channels := range []int{a.width, 2 * a.width} {
			for block := range a.blocks {
				stride := 1
				if stage > 0 && block == 0 {
					stride = 2
				}
				x = basicBlock(he.In(fmt.Sprintf("stage%d_block%d", stage+1, block+1)), x, channels, stride)
			}
		}
		x = ReduceMean(x, 1, 2) // global average pooling: [batch, 7, 7, channels] → [batch, channels]
		x = layers.DropoutStatic(ctx, x, a.dropout)
		head := ctx.In("head").WithInitializer(initializers.XavierUniformFn(ctx))
		return []*Node{layers.Dense(head, x, true, fashionmnist.NumClasses)}
	}
}

// standardise turns the dataset's uint8 pixels into centred, scaled floats: (pixels/255 − mean) / std,
// folded into one shift and one scale of the converted bytes.
func standardise(pixels *Node) *Node {
	x := ConvertDType(pixels, dtypes.Float32)
	return MulScalar(AddScalar(x, -pixelMean*fashionmnist.MaxPixel), 1/(pixelStd*fashionmnist.MaxPixel))
}

// basicBlock is ResNet's basic block. Where it changes the resolution or the channels, its shortcut is a
// strided 1×1 convolution and a batch normalization (a projection); otherwise the block's input itself.
func basicBlock(ctx *context.Context, x *Node, channels, stride int) *Node {
	shortcut := x
	if stride != 1 || x.Shape().Dim(-1) != channels {
		shortcut = convBN(ctx.In("shortcut"), x, channels, 1, stride)
	}
	y := activations.Relu(convBN(ctx.In("conv1"), x, channels, 3, stride))
	y = convBN(ctx.In("conv2"), y, channels, 3, 1)
	return activations.Relu(Add(y, shortcut))
}

// convBN is a size×size convolution without bias, padded by size/2 on every side as PyTorch's
// Conv2d(padding=size//2) is, followed by batch normalization over the channels.
//
// At stride 1 that is GoMLX's PadSame. At stride 2 on an even size it is not: "same" padding puts the
// whole pixel of padding after the image (TensorFlow's convention), so the 3×3 windows would be centred on
// odd pixels while a 1×1 strided projection samples the even ones. Padding explicitly keeps both on the
// same grid, and the model the same as its PyTorch twin.
func convBN(ctx *context.Context, x *Node, channels, size, stride int) *Node {
	if stride > 1 && size > 1 {
		space := PadAxis{Start: size / 2, End: size / 2}
		x = Pad(x, ScalarZero(x.Graph(), x.DType()), PadAxis{}, space, space, PadAxis{})
	}
	conv := layers.Convolution(ctx, x).Filters(channels).KernelSize(size).Strides(stride).UseBias(false)
	if stride == 1 {
		conv.PadSame()
	} else {
		conv.NoPadding()
	}
	return batchnorm.New(ctx, conv.Done(), -1).Momentum(bnMomentum).Epsilon(bnEpsilon).Done()
}
