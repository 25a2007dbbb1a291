package blas

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/goaccel/goaccel/cpu/internal/gemmtile"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
)

// benchmarkProducts are the float32 DotGenerals of a dense layer's training step at the sizes of a small
// (784→128, batch 64) and a big (784→512→512, batch 256) MLP: forward x·W, weights gradient xᵀ·dy and input
// gradient dy·Wᵀ, plus one attention-score layout that needs a copy into gemm order.
var benchmarkProducts = []struct {
	name                     string
	lhsDims, rhsDims         []int
	lhsContracting, lhsBatch []int
	rhsContracting, rhsBatch []int
	flops                    float64
}{
	{"x·W/64x784x128", []int{64, 784}, []int{784, 128}, []int{1}, nil, []int{0}, nil, 2 * 64 * 784 * 128},
	{"x·W/256x784x512", []int{256, 784}, []int{784, 512}, []int{1}, nil, []int{0}, nil, 2 * 256 * 784 * 512},
	{"x·W/256x512x512", []int{256, 512}, []int{512, 512}, []int{1}, nil, []int{0}, nil, 2 * 256 * 512 * 512},
	{"xT·dy/784x64x128", []int{64, 784}, []int{64, 128}, []int{0}, nil, []int{0}, nil, 2 * 784 * 64 * 128},
	{"xT·dy/784x256x512", []int{256, 784}, []int{256, 512}, []int{0}, nil, []int{0}, nil, 2 * 784 * 256 * 512},
	{"xT·dy/512x256x512", []int{256, 512}, []int{256, 512}, []int{0}, nil, []int{0}, nil, 2 * 512 * 256 * 512},
	// The transformer example's weight gradients: 2048 positions (batch 32 × context 64), width 128, MLP 512.
	{"xT·dy/128x2048x128", []int{2048, 128}, []int{2048, 128}, []int{0}, nil, []int{0}, nil, 2 * 128 * 2048 * 128},
	{"xT·dy/512x2048x128", []int{2048, 512}, []int{2048, 128}, []int{0}, nil, []int{0}, nil, 2 * 512 * 2048 * 128},
	{"xT·dy/128x2048x512", []int{2048, 128}, []int{2048, 512}, []int{0}, nil, []int{0}, nil, 2 * 128 * 2048 * 512},
	{"dy·WT/64x128x784", []int{64, 128}, []int{784, 128}, []int{1}, nil, []int{1}, nil, 2 * 64 * 128 * 784},
	{"dy·WT/256x512x784", []int{256, 512}, []int{784, 512}, []int{1}, nil, []int{1}, nil, 2 * 256 * 512 * 784},
	{"dy·WT/256x512x512", []int{256, 512}, []int{512, 512}, []int{1}, nil, []int{1}, nil, 2 * 256 * 512 * 512},
	// [batch, seq, heads, dim] queries·keys over dim, batch axes (batch, heads): not a gemm layout in place.
	{"attention/8x64x4x32", []int{8, 64, 4, 32}, []int{8, 64, 4, 32}, []int{3}, []int{0, 2}, []int{3}, []int{0, 2},
		2 * 8 * 4 * 64 * 64 * 32},
}

// BenchmarkDotGeneral compares simplego's own kernel with the installed one (gonum without the blas tag,
// OpenBLAS at 1 and 2 threads with it, and gemmtile's 512-bit tiles where the processor has AVX-512) and
// reports GFLOP/s.
func BenchmarkDotGeneral(b *testing.B) {
	backend := newBackend(b)
	rng := rand.New(rand.NewPCG(9, 10))
	type kernel struct {
		name    string
		threads int  // 0: simplego's own kernel.
		tiles   bool // float32 on gemmtile's 512-bit tiles rather than OpenBLAS (blas build)
	}
	kernels := []kernel{{"simplego", 0, false}}
	if Built {
		kernels = append(kernels, kernel{"openblas-1t", 1, false}, kernel{"openblas-2t", 2, false})
		if gemmtile.Wide() {
			kernels = append(kernels, kernel{"tiles-1t", 1, true}, kernel{"tiles-2t", 2, true})
		}
	} else {
		kernels = append(kernels, kernel{"gonum", -1, false})
	}
	for _, product := range benchmarkProducts {
		lhs := randomTensor(rng, dtypes.Float32, product.lhsDims)
		rhs := randomTensor(rng, dtypes.Float32, product.rhsDims)
		exec := graph.MustNewExec(backend, func(lhs, rhs *graph.Node) *graph.Node {
			return graph.DotGeneral(lhs, product.lhsContracting, product.lhsBatch, rhs, product.rhsContracting,
				product.rhsBatch)
		})
		for _, k := range kernels {
			b.Run(fmt.Sprintf("%s/%s", product.name, k.name), func(b *testing.B) {
				if k.threads == 0 {
					Uninstall()
				} else if err := Install(k.threads); err != nil {
					b.Fatal(err)
				}
				defer Uninstall()
				defer forceFloat32Tiles(k.tiles)()
				exec.MustExec1(lhs, rhs).MustFinalizeAll() // Warm up: compile, move inputs on device.
				for b.Loop() {
					exec.MustExec1(lhs, rhs).MustFinalizeAll()
				}
				b.ReportMetric(product.flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
		exec.Finalize()
	}
}
