package extraops_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/require"
)

// bnDecomposed is batch normalization written with GoMLX ops simplego has (as batchnorm's
// directBatchNormGraph does): the batch mean and biased variance, and the normalized operand.
func bnDecomposed(x, scale, offset *graph.Node, epsilon float64, featureAxis int) (y, mean, variance *graph.Node) {
	var others []int
	dims := make([]int, x.Rank())
	for a := range x.Rank() {
		dims[a] = 1
		if a != featureAxis {
			others = append(others, a)
		}
	}
	dims[featureAxis] = x.Shape().Dimensions[featureAxis]
	mean, variance = x, graph.ZerosLike(x) // One element per feature.
	if len(others) > 0 {
		mean = graph.ReduceMean(x, others...)
		centered := graph.Sub(x, graph.Reshape(mean, dims...))
		variance = graph.ReduceMean(graph.Square(centered), others...)
	}
	y = bnApply(x, scale, offset, mean, variance, epsilon, featureAxis)
	return y, mean, variance
}

func bnApply(x, scale, offset, mean, variance *graph.Node, epsilon float64, featureAxis int) *graph.Node {
	dims := make([]int, x.Rank())
	for a := range dims {
		dims[a] = 1
	}
	dims[featureAxis] = x.Shape().Dimensions[featureAxis]
	expand := func(v *graph.Node) *graph.Node { return graph.Reshape(v, dims...) }
	normalized := graph.Div(graph.Sub(x, expand(mean)), graph.Sqrt(graph.AddScalar(expand(variance), epsilon)))
	return graph.Add(graph.Mul(normalized, expand(scale)), expand(offset))
}

// bnCase is an operand shape and its feature axis.
type bnCase struct {
	dims        []int
	featureAxis int
}

var bnCases = []bnCase{{[]int{5}, 0}, {[]int{4, 3}, 1}, {[]int{4, 3}, 0}, {[]int{2, 3, 4}, 1}, {[]int{2, 3, 2, 4}, 3},
	{[]int{3, 2, 5}, 0}}

// TestBatchNormForward compares the three batch normalization ops with their decomposition into ops simplego
// has, in float32 and float64.
func TestBatchNormForward(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const epsilon = 1.0 / 1024 // Exact in float32, the ops' epsilon.
	for _, c := range bnCases {
		features := c.dims[c.featureAxis]
		x := randomTensor(rng, c.dims...)
		scale, offset := randomTensor(rng, features), randomTensor(rng, features)
		mean := randomTensor(rng, features)
		variance := tensors.FromFlatDataAndDimensions(positive(rng, features), features)
		g := randomTensor(rng, c.dims...)
		for _, dtype := range []dtypes.DType{dtypes.Float64, dtypes.Float32} {
			tolerance := 1e-12
			if dtype == dtypes.Float32 {
				tolerance = 1e-5
			}
			t.Run(fmt.Sprintf("%v/axis%d/%s", c.dims, c.featureAxis, dtype), func(t *testing.T) {
				compare := func(name string, got, want func(xs []*graph.Node) *graph.Node) {
					t.Helper()
					inputs := []*tensors.Tensor{x, scale, offset, mean, variance, g}
					cast := func(fn func(xs []*graph.Node) *graph.Node) func(xs []*graph.Node) *graph.Node {
						return func(xs []*graph.Node) *graph.Node {
							converted := make([]*graph.Node, len(xs))
							for i, x := range xs {
								converted[i] = graph.ConvertDType(x, dtype)
							}
							return graph.ConvertDType(fn(converted), dtypes.Float64)
						}
					}
					gotValues, wantValues := float64s(t, run(t, cast(got), inputs...)), float64s(t, run(t, cast(want), inputs...))
					require.Len(t, gotValues, len(wantValues))
					for i := range wantValues {
						require.InDelta(t, wantValues[i], gotValues[i], tolerance*(1+abs(wantValues[i])), "%s element %d", name, i)
					}
				}
				flatten := func(nodes ...*graph.Node) *graph.Node {
					for i, n := range nodes {
						nodes[i] = graph.Reshape(n, -1)
					}
					return graph.Concatenate(nodes, 0)
				}
				compare("BatchNormForTraining", func(xs []*graph.Node) *graph.Node {
					y, m, v := graph.InternalBatchNormForTraining(xs[0], xs[1], xs[2], epsilon, c.featureAxis)
					return flatten(y, m, v)
				}, func(xs []*graph.Node) *graph.Node {
					y, m, v := bnDecomposed(xs[0], xs[1], xs[2], epsilon, c.featureAxis)
					return flatten(y, m, v)
				})
				compare("BatchNormForInference", func(xs []*graph.Node) *graph.Node {
					return graph.InternalBatchNormForInference(xs[0], xs[1], xs[2], xs[3], xs[4], epsilon, c.featureAxis)
				}, func(xs []*graph.Node) *graph.Node {
					return bnApply(xs[0], xs[1], xs[2], xs[3], xs[4], epsilon, c.featureAxis)
				})
				// BatchNormGradient at the batch's own statistics is the gradient of the decomposition.
				compare("BatchNormGradient", func(xs []*graph.Node) *graph.Node {
					_, m, v := graph.InternalBatchNormForTraining(xs[0], xs[1], xs[2], epsilon, c.featureAxis)
					gx, gs, go_ := graph.InternalBatchNormGradient(xs[0], xs[1], m, v, xs[5], epsilon, c.featureAxis)
					return flatten(gx, gs, go_)
				}, func(xs []*graph.Node) *graph.Node {
					y, _, _ := bnDecomposed(xs[0], xs[1], xs[2], epsilon, c.featureAxis)
					grads := graph.Gradient(graph.ReduceAllSum(graph.Mul(y, xs[5])), xs[0], xs[1], xs[2])
					return flatten(grads...)
				})
			})
		}
	}
}

// TestBatchNormGradients checks the gradients of the three ops (BatchNormGradient's is a second derivative)
// against central differences.
func TestBatchNormGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const epsilon = 1.0 / 64
	for _, c := range bnCases {
		features := c.dims[c.featureAxis]
		t.Run(fmt.Sprintf("%v/axis%d", c.dims, c.featureAxis), func(t *testing.T) {
			x := randomTensor(rng, c.dims...)
			scale, offset := randomTensor(rng, features), randomTensor(rng, features)
			mean := randomTensor(rng, features)
			variance := tensors.FromFlatDataAndDimensions(positive(rng, features), features)
			g := randomTensor(rng, c.dims...)
			t.Run("ForTraining", func(t *testing.T) {
				gradCase{f: func(xs []*graph.Node) *graph.Node {
					y, _, _ := graph.InternalBatchNormForTraining(xs[0], xs[1], xs[2], epsilon, c.featureAxis)
					return y
				}, inputs: []*tensors.Tensor{x, scale, offset}, diff: []bool{true, true, true}}.check(t)
			})
			t.Run("ForInference", func(t *testing.T) {
				gradCase{f: func(xs []*graph.Node) *graph.Node {
					return graph.InternalBatchNormForInference(xs[0], xs[1], xs[2], xs[3], xs[4], epsilon, c.featureAxis)
				}, inputs: []*tensors.Tensor{x, scale, offset, mean, variance}, diff: []bool{true, true, true, true, true}}.check(t)
			})
			t.Run("Gradient", func(t *testing.T) {
				gradCase{f: func(xs []*graph.Node) *graph.Node {
					gx, gs, go_ := graph.InternalBatchNormGradient(xs[0], xs[1], xs[2], xs[3], xs[4], epsilon, c.featureAxis)
					return graph.Concatenate([]*graph.Node{graph.Reshape(gx, -1), gs, go_}, 0)
				}, inputs: []*tensors.Tensor{x, scale, mean, variance, g}, diff: []bool{true, true, true, true, true}}.check(t)
			})
		})
	}
}

// TestBatchNormSecondOrder differentiates a gradient of a batch-normalized model (a gradient penalty): the
// BatchNormGradient that BatchNormForTraining's gradient builds is differentiated in turn.
func TestBatchNormSecondOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	x, scale, offset := randomTensor(rng, 4, 3), randomTensor(rng, 3), randomTensor(rng, 3)
	gradCase{f: func(xs []*graph.Node) *graph.Node {
		y, _, _ := graph.InternalBatchNormForTraining(xs[0], xs[1], xs[2], 1.0/64, 1)
		loss := graph.ReduceAllSum(graph.Mul(graph.Square(y), weights(y.Graph(), y.Shape())))
		return graph.Gradient(loss, xs[0])[0]
	}, inputs: []*tensors.Tensor{x, scale, offset}, diff: []bool{true, true, true}}.check(t)
}

// positive returns n values in [0.5, 1.5).
func positive(rng *rand.Rand, n int) []float64 {
	values := make([]float64, n)
	for i := range values {
		values[i] = 0.5 + rng.Float64()
	}
	return values
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
