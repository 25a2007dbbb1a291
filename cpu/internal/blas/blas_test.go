package blas

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/dtypes/bfloat16"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/cpu/internal/gemmtile"
	"github.com/goaccel/goaccel/cpu/internal/gomlxpatch"
	"github.com/goaccel/goaccel/cpu/internal/threads"
)

// pinnedGoMLXVersion is the GoMLX release whose simplego internals (executor table, Node.data,
// dotGeneralNodeData) this package was checked against.
const pinnedGoMLXVersion = "v0.26.0"

func TestMain(m *testing.M) {
	// Never let GoMLX fetch XLA plugins from a test.
	_ = os.Setenv("GOMLX_NO_AUTO_INSTALL", "1")
	os.Exit(m.Run())
}

func newBackend(t testing.TB) backends.Backend {
	t.Helper()
	backend, err := simplego.New("")
	require.NoError(t, err)
	t.Cleanup(backend.Finalize)
	return backend
}

func randomFlat[T float32 | float64](rng *rand.Rand, size int) []T {
	flat := make([]T, size)
	for i := range flat {
		flat[i] = T(2*rng.Float64() - 1)
	}
	return flat
}

// randomTensor returns a tensor of the given dtype (Float32, Float64 or BFloat16) with values in [-1, 1).
func randomTensor(rng *rand.Rand, dtype dtypes.DType, dims []int) *tensors.Tensor {
	switch dtype {
	case dtypes.Float32:
		return tensors.FromFlatDataAndDimensions(randomFlat[float32](rng, product(dims)), dims...)
	case dtypes.Float64:
		return tensors.FromFlatDataAndDimensions(randomFlat[float64](rng, product(dims)), dims...)
	case dtypes.BFloat16:
		flat := make([]bfloat16.BFloat16, product(dims))
		for i := range flat {
			flat[i] = bfloat16.FromFloat32(2*rng.Float32() - 1)
		}
		return tensors.FromFlatDataAndDimensions(flat, dims...)
	}
	panic(fmt.Sprintf("randomTensor: unsupported dtype %s", dtype))
}

// float64Values returns a tensor's values as float64, for comparisons across dtypes.
func float64Values(t *tensors.Tensor) []float64 {
	values := make([]float64, t.Size())
	switch t.DType() {
	case dtypes.Float32:
		for i, v := range tensors.MustCopyFlatData[float32](t) {
			values[i] = float64(v)
		}
	case dtypes.Float64:
		copy(values, tensors.MustCopyFlatData[float64](t))
	case dtypes.BFloat16:
		for i, v := range tensors.MustCopyFlatData[bfloat16.BFloat16](t) {
			values[i] = float64(v.Float32())
		}
	default:
		panic(fmt.Sprintf("float64Values: unsupported dtype %s", t.DType()))
	}
	return values
}

// linkedGoMLXVersion returns the version of the GoMLX module linked into the test binary. Test binaries carry
// no module dependencies in their build info, so when those are missing it reads the version from the source
// path recorded for a simplego function, ".../github.com/gomlx/gomlx@VERSION/backends/simplego/...", which
// holds with and without -trimpath.
func linkedGoMLXVersion(t *testing.T) string {
	t.Helper()
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "github.com/gomlx/gomlx" {
				if dep.Replace != nil {
					return dep.Replace.Version
				}
				return dep.Version
			}
		}
	}
	file, _ := runtime.FuncForPC(reflect.ValueOf(simplego.New).Pointer()).FileLine(0)
	const modulePrefix = "github.com/gomlx/gomlx@"
	start := strings.Index(file, modulePrefix)
	require.GreaterOrEqual(t, start, 0, "simplego is not built from a versioned GoMLX module: %s", file)
	version, _, _ := strings.Cut(file[start+len(modulePrefix):], "/")
	return version
}

// TestPinnedInternals fails loudly, rather than letting simplego's kernel silently take over again, when
// the GoMLX version or the internals this package patches change.
func TestPinnedInternals(t *testing.T) {
	require.Equal(t, pinnedGoMLXVersion, linkedGoMLXVersion(t),
		"GoMLX version changed: re-check simplego's nodeExecutors table, Node.data and dotGeneralNodeData "+
			"against cpu/internal/gomlxpatch (simplego.go, params.go) and this package's params.go, then update the pin")

	require.NoError(t, gomlxpatch.CheckSimplegoLayout())
	require.NoError(t, Install(0))
	t.Cleanup(Uninstall)
	require.True(t, Installed())

	backend := newBackend(t)
	rng := rand.New(rand.NewPCG(1, 2))
	x := tensors.FromFlatDataAndDimensions(randomFlat[float32](rng, 64*784), 64, 784)
	w := tensors.FromFlatDataAndDimensions(randomFlat[float32](rng, 784*128), 784, 128)
	matmul := graph.MustNewExec(backend, graph.Dot)

	before := Calls()
	got := matmul.MustExec1(x, w)
	after := Calls()
	assert.Equal(t, before.Direct+1, after.Direct, "[64,784]x[784,128] float32 did not run on the gemm kernel in place")
	assert.Equal(t, before.Fallback, after.Fallback)

	Uninstall()
	want := matmul.MustExec1(x, w)
	assert.Equal(t, after, Calls(), "Uninstall left the kernel in simplego's table")
	assert.Less(t, relativeError(tensors.MustCopyFlatData[float32](got), tensors.MustCopyFlatData[float32](want)), 1e-5)
}

func TestInstallUninstall(t *testing.T) {
	require.NoError(t, Install(1))
	require.NoError(t, Install(0), "Install must be idempotent")
	assert.True(t, Installed())
	assert.NotEqual(t, "pure Go (simplego)", Path())
	t.Logf("kernel: %s", Path())
	if Built {
		assert.Equal(t, 1, Threads())
		require.NoError(t, Install(2))
		assert.Equal(t, 2, Threads())
		assert.Contains(t, Path(), "OpenBLAS")
		assert.Contains(t, Path(), "2 threads")
	} else if gemmtile.Wide() {
		assert.Equal(t, "pure Go (AVX-512 micro-kernel; gonum for float64)", Path())
	} else if gemmtile.Accelerated() {
		assert.Equal(t, "pure Go (AVX2/FMA micro-kernel; gonum for float64)", Path())
	} else {
		assert.Equal(t, "pure Go (gonum)", Path())
	}
	Uninstall()
	Uninstall()
	assert.False(t, Installed())
	assert.Equal(t, "pure Go (simplego)", Path())
	_, priority := gomlxpatch.CurrentExecutor(backends.OpTypeDotGeneral)
	assert.Equal(t, priorityGenericForTest, priority,
		"Uninstall must restore simplego's own priority")
}

// priorityGenericForTest is the priority simplego registers its DotGeneral executor with.
const priorityGenericForTest = 0

// dotGeneralCase is one random DotGeneral: operand dimensions and axes as passed to graph.DotGeneral.
type dotGeneralCase struct {
	lhsDims, rhsDims                                   []int
	lhsContracting, lhsBatch, rhsContracting, rhsBatch []int
}

// randomDotGeneralCase draws 0–2 batch, 0–2 contracting (0: an outer product) and 0–2 cross axes per
// operand, and shuffles each operand's axes half the time, so cases cover in-place gemm layouts and layouts
// that need a copy.
func randomDotGeneralCase(rng *rand.Rand) dotGeneralCase {
	numBatch, numContracting := rng.IntN(3), rng.IntN(3)
	dim := func() int { return 1 + rng.IntN(6) }
	batchDims, contractingDims := make([]int, numBatch), make([]int, numContracting)
	for i := range batchDims {
		batchDims[i] = dim()
	}
	for i := range contractingDims {
		contractingDims[i] = dim()
	}
	// operand returns dims and, for each batch/contracting index, the axis holding it.
	operand := func(contractingFirst bool) (dims, batchAxes, contractingAxes []int) {
		numCross := rng.IntN(3)
		type axisRole struct{ kind, index, dim int } // kind 0: batch, 1: contracting, 2: cross.
		var roles []axisRole
		for i, d := range batchDims {
			roles = append(roles, axisRole{0, i, d})
		}
		crossRoles := make([]axisRole, numCross)
		for i := range crossRoles {
			crossRoles[i] = axisRole{2, i, dim()}
		}
		var contractingRoles []axisRole
		for i, d := range contractingDims {
			contractingRoles = append(contractingRoles, axisRole{1, i, d})
		}
		if contractingFirst {
			roles = append(append(roles, contractingRoles...), crossRoles...)
		} else {
			roles = append(append(roles, crossRoles...), contractingRoles...)
		}
		if rng.IntN(2) == 0 {
			rng.Shuffle(len(roles), func(i, j int) { roles[i], roles[j] = roles[j], roles[i] })
		}
		batchAxes, contractingAxes = make([]int, numBatch), make([]int, numContracting)
		for axis, role := range roles {
			dims = append(dims, role.dim)
			switch role.kind {
			case 0:
				batchAxes[role.index] = axis
			case 1:
				contractingAxes[role.index] = axis
			}
		}
		return dims, batchAxes, contractingAxes
	}
	var c dotGeneralCase
	c.lhsDims, c.lhsBatch, c.lhsContracting = operand(rng.IntN(2) == 0)
	c.rhsDims, c.rhsBatch, c.rhsContracting = operand(rng.IntN(2) == 0)
	return c
}

func (c dotGeneralCase) String() string {
	return fmt.Sprintf("lhs%v(c%v,b%v)·rhs%v(c%v,b%v)", c.lhsDims, c.lhsContracting, c.lhsBatch,
		c.rhsDims, c.rhsContracting, c.rhsBatch)
}

// relativeError is ‖got−want‖ / max(‖want‖, tiny), in float64.
func relativeError[T float32 | float64](got, want []T) float64 {
	var diff, norm float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		diff += d * d
		norm += float64(want[i]) * float64(want[i])
	}
	return math.Sqrt(diff) / math.Max(math.Sqrt(norm), 1e-30)
}

// checkAgainstSimplego runs the case with the kernel installed and with simplego's own executor and
// compares the results.
func checkAgainstSimplego(t *testing.T, backend backends.Backend, rng *rand.Rand, dtype dtypes.DType,
	c dotGeneralCase) {
	t.Helper()
	lhs, rhs := randomTensor(rng, dtype, c.lhsDims), randomTensor(rng, dtype, c.rhsDims)
	exec := graph.MustNewExec(backend, func(lhs, rhs *graph.Node) *graph.Node {
		return graph.DotGeneral(lhs, c.lhsContracting, c.lhsBatch, rhs, c.rhsContracting, c.rhsBatch)
	})
	defer exec.Finalize()
	require.NoError(t, Install(0))
	got := exec.MustExec1(lhs, rhs)
	Uninstall()
	want := exec.MustExec1(lhs, rhs)
	require.Equal(t, want.Shape(), got.Shape(), "%s", c)
	assert.LessOrEqual(t, relativeError(float64Values(got), float64Values(want)), 1e-5, "%s %s", dtype, c)
}

// TestRandomLayoutsMatchSimplego compares the kernel with simplego's own over random DotGeneral layouts and
// checks that all three paths (in place, copied into gemm order, fallback) were taken.
func TestRandomLayoutsMatchSimplego(t *testing.T) { float32Kernels(t, testRandomLayoutsMatchSimplego) }

func testRandomLayoutsMatchSimplego(t *testing.T) {
	backend := newBackend(t)
	rng := rand.New(rand.NewPCG(3, 4))
	before := Calls()
	t.Cleanup(func() { copyToGemmOrder = true })
	for i := range 300 {
		c := randomDotGeneralCase(rng)
		// A quarter of the cases run with copying disabled, so float layouts the transpose flags do not
		// cover exercise the fallback too.
		copyToGemmOrder = i%4 != 3
		dtype := dtypes.Float32
		switch {
		case i%10 == 9:
			// A dtype the kernel leaves to simplego. (Not an integer one: simplego v0.26.0's own large
			// DotGeneral kernel indexes out of range for int32/int64 on some batched shapes.)
			dtype = dtypes.BFloat16
		case i%2 == 1:
			dtype = dtypes.Float64
		}
		checkAgainstSimplego(t, backend, rng, dtype, c)
	}
	after := Calls()
	t.Logf("direct=%d (strided %d) copied=%d fallback=%d", after.Direct-before.Direct,
		after.Strided-before.Strided, after.Copied-before.Copied, after.Fallback-before.Fallback)
	assert.Positive(t, after.Direct-before.Direct, "no case ran on the kernel in place")
	assert.Positive(t, after.Strided-before.Strided, "no case ran on the kernel in place with strides")
	assert.Positive(t, after.Copied-before.Copied, "no case ran on the kernel after a copy")
	assert.Positive(t, after.Fallback-before.Fallback, "no case fell back to simplego")
}

// randomStridedCase draws a DotGeneral whose operands keep their cross axes together and their contracting
// axes together, in pair order, with the batch axes anywhere before the last axis: the layouts that run in
// place with strides (attention's [batch, seq, heads, dim] and its gradients among them).
func randomStridedCase(rng *rand.Rand) dotGeneralCase {
	dim := func() int { return 1 + rng.IntN(5) }
	batchDims, contractingDims := make([]int, 1+rng.IntN(2)), make([]int, 1+rng.IntN(2))
	for i := range batchDims {
		batchDims[i] = dim()
	}
	for i := range contractingDims {
		contractingDims[i] = dim()
	}
	operand := func() (dims, batchAxes, contractingAxes []int) {
		type group struct {
			contracting bool
			dims        []int
		}
		cross := group{false, make([]int, 1+rng.IntN(2))}
		for i := range cross.dims {
			cross.dims[i] = dim()
		}
		groups := []group{cross, {true, contractingDims}}
		if rng.IntN(2) == 0 {
			groups[0], groups[1] = groups[1], groups[0]
		}
		// Each batch axis goes before the first group or between the two.
		slots := make([][]int, 2)
		for i := range batchDims {
			slot := rng.IntN(2)
			slots[slot] = append(slots[slot], i)
		}
		batchAxes, contractingAxes = make([]int, len(batchDims)), make([]int, len(contractingDims))
		for g, grp := range groups {
			for _, i := range slots[g] {
				batchAxes[i] = len(dims)
				dims = append(dims, batchDims[i])
			}
			for i, d := range grp.dims {
				if grp.contracting {
					contractingAxes[i] = len(dims)
				}
				dims = append(dims, d)
			}
		}
		return dims, batchAxes, contractingAxes
	}
	var c dotGeneralCase
	c.lhsDims, c.lhsBatch, c.lhsContracting = operand()
	c.rhsDims, c.rhsBatch, c.rhsContracting = operand()
	return c
}

// TestStridedLayoutsMatchSimplego compares the strided in-place path with simplego's own executor, in
// float32 and float64, and checks that it ran.
func TestStridedLayoutsMatchSimplego(t *testing.T) {
	float32Kernels(t, testStridedLayoutsMatchSimplego)
}

func testStridedLayoutsMatchSimplego(t *testing.T) {
	backend := newBackend(t)
	rng := rand.New(rand.NewPCG(7, 8))
	before := Calls()
	const cases = 120
	for i := range cases {
		dtype := dtypes.Float32
		if i%2 == 1 {
			dtype = dtypes.Float64
		}
		checkAgainstSimplego(t, backend, rng, dtype, randomStridedCase(rng))
	}
	after := Calls()
	t.Logf("direct=%d (strided %d) copied=%d", after.Direct-before.Direct, after.Strided-before.Strided,
		after.Copied-before.Copied)
	assert.Greater(t, after.Strided-before.Strided, uint64(cases/4), "too few cases ran strided")
	assert.Zero(t, after.Fallback-before.Fallback, "a float case fell back to simplego")
}

// TestPlanMLPShapes checks that the products of a dense layer's forward and backward passes run in place,
// with gemm transpose flags rather than copies.
func TestPlanMLPShapes(t *testing.T) {
	for _, tc := range []struct {
		name                           string
		lhsDims, rhsDims               []int
		lhsContracting, rhsContracting []int
		transA, transB                 bool
	}{
		{"forward x·W", []int{64, 784}, []int{784, 128}, []int{1}, []int{0}, false, false},
		{"weights grad xᵀ·dy", []int{64, 784}, []int{64, 128}, []int{0}, []int{0}, true, false},
		{"input grad dy·Wᵀ", []int{64, 128}, []int{784, 128}, []int{1}, []int{1}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := &dotGeneralParams{
				lhsContractingAxes: tc.lhsContracting, rhsContractingAxes: tc.rhsContracting,
				batchSize: 1, lhsCrossSize: product(tc.lhsDims) / tc.lhsDims[tc.lhsContracting[0]],
				rhsCrossSize:    product(tc.rhsDims) / tc.rhsDims[tc.rhsContracting[0]],
				contractingSize: tc.lhsDims[tc.lhsContracting[0]],
			}
			plan, ok := planGemm(tc.lhsDims, tc.rhsDims, params, false)
			require.True(t, ok)
			assert.Equal(t, tc.transA, plan.gemm.transA)
			assert.Equal(t, tc.transB, plan.gemm.transB)
			assert.Nil(t, plan.lhsPermutation)
			assert.Nil(t, plan.rhsPermutation)
		})
	}
}

// TestPlanAttentionScores checks a layout no transpose flag covers: queries·keys over [batch, seq, heads, dim]
// with batch axes (batch, heads) runs in place as batch·heads matrices [seq, dim] whose rows lie heads·dim
// apart, keys entering the gemm transposed, with no copy.
func TestPlanAttentionScores(t *testing.T) {
	dims := []int{8, 64, 4, 32}
	params := &dotGeneralParams{
		lhsContractingAxes: []int{3}, lhsBatchAxes: []int{0, 2},
		rhsContractingAxes: []int{3}, rhsBatchAxes: []int{0, 2},
		batchSize: 8 * 4, lhsCrossSize: 64, rhsCrossSize: 64, contractingSize: 32,
	}
	plan, ok := planGemm(dims, dims, params, false)
	require.True(t, ok, "a strided layout needs no copy")
	assert.Nil(t, plan.lhsPermutation)
	assert.Nil(t, plan.rhsPermutation)
	offsets := make([]int64, 0, 32)
	for b := range 8 {
		for h := range 4 {
			offsets = append(offsets, int64(b*64*4*32+h*32))
		}
	}
	assert.Equal(t, gemmShape{batch: 32, m: 64, n: 64, k: 32, transB: true, ldA: 4 * 32, ldB: 4 * 32,
		offA: offsets, offB: offsets}, plan.gemm)
}

// TestPlanStridedOrCopied checks which layouts run strided in place and which are still copied.
func TestPlanStridedOrCopied(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		dims, batch, contract []int
		isLHS                 bool
		want                  operandLayout
	}{
		{"coefficients [b,t,h,s]·… contracting s", []int{2, 3, 4, 5}, []int{0, 2}, []int{3}, true,
			operandLayout{contractingLast: true, ld: 20, offsets: []int64{0, 5, 10, 15, 60, 65, 70, 75}}},
		{"values […,s,h,d] contracting s, rows d", []int{2, 5, 4, 6}, []int{0, 2}, []int{1}, false,
			operandLayout{contractingLast: false, ld: 24, offsets: []int64{0, 6, 12, 18, 120, 126, 132, 138}}},
		{"batch axis last: copied", []int{3, 4, 2}, []int{2}, []int{1}, true,
			operandLayout{contractingLast: true, permutation: []int{2, 0, 1}}},
		{"rows split by the batch axis: copied", []int{3, 2, 4, 5}, []int{1}, []int{3}, true,
			operandLayout{contractingLast: true, permutation: []int{1, 0, 2, 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, layoutOperand(tc.dims, tc.batch, tc.contract, tc.isLHS))
		})
	}
}

func TestTransposeInto(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	// Random small cases, then cases larger than a transposeTile with partial tiles.
	type transposeCase struct{ dims, permutation []int }
	var cases []transposeCase
	for range 200 {
		rank := 1 + rng.IntN(5)
		dims := make([]int, rank)
		for i := range dims {
			dims[i] = 1 + rng.IntN(4)
		}
		cases = append(cases, transposeCase{dims, rng.Perm(rank)})
	}
	cases = append(cases, transposeCase{[]int{70, 45}, []int{1, 0}}, transposeCase{[]int{3, 40, 37}, []int{0, 2, 1}},
		transposeCase{[]int{40, 3, 37}, []int{2, 1, 0}}, transposeCase{[]int{33, 2, 65}, []int{1, 2, 0}})
	// Large enough to split over the threads: by blocks (attention's heads), by rows of one block, and by rows
	// of fewer blocks than threads.
	defer threads.Set(threads.Budget())
	threads.Set(3)
	cases = append(cases, transposeCase{[]int{32, 64, 4, 32}, []int{0, 2, 1, 3}}, transposeCase{[]int{300, 200}, []int{1, 0}},
		transposeCase{[]int{3, 200, 150}, []int{0, 2, 1}}, transposeCase{[]int{2, 190, 170}, []int{0, 2, 1}},
		transposeCase{[]int{5, 7, 40, 33}, []int{3, 1, 0, 2}})
	for _, tc := range cases {
		dims, permutation, rank := tc.dims, tc.permutation, len(tc.dims)
		src := randomFlat[float64](rng, product(dims))
		dst := make([]float64, len(src))
		transposeInto(dst, src, dims, permutation)

		// Reference: walk dst indices and gather each from src.
		dstDims := permute(dims, permutation)
		index := make([]int, rank)
		for flat := range dst {
			rest := flat
			for axis := rank - 1; axis >= 0; axis-- {
				index[axis] = rest % dstDims[axis]
				rest /= dstDims[axis]
			}
			srcFlat := 0
			for axis := range rank {
				srcIndex := index[slices.Index(permutation, axis)]
				srcFlat = srcFlat*dims[axis] + srcIndex
			}
			require.Equal(t, src[srcFlat], dst[flat], "dims=%v permutation=%v flat=%d", dims, permutation, flat)
		}
	}
}

// TestConcurrentExecutions runs products from several goroutines at once, as simplego does when it executes
// independent ops in parallel.
func TestConcurrentExecutions(t *testing.T) {
	require.NoError(t, Install(0))
	t.Cleanup(Uninstall)
	backend := newBackend(t)
	rng := rand.New(rand.NewPCG(7, 8))
	x := tensors.FromFlatDataAndDimensions(randomFlat[float32](rng, 32*200), 32, 200)
	w := tensors.FromFlatDataAndDimensions(randomFlat[float32](rng, 200*50), 200, 50)
	matmul := graph.MustNewExec(backend, graph.Dot)
	want := tensors.MustCopyFlatData[float32](matmul.MustExec1(x, w))
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for range 20 {
				got := tensors.MustCopyFlatData[float32](matmul.MustExec1(x, w))
				if e := relativeError(got, want); e > 1e-6 {
					errs <- fmt.Errorf("relative error %g", e)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
}

// TestSmallPlainProductsMatchSimplego: plain products of 64 rows or more with a small B, which run on the
// 512-bit tiles beside OpenBLAS where the processor has AVX-512 (tilesBeatOpenBLAS), give simplego's values
// within rounding, under every sharing of the products between the kernels.
func TestSmallPlainProductsMatchSimplego(t *testing.T) {
	float32Kernels(t, func(t *testing.T) {
		backend := newBackend(t)
		rng := rand.New(rand.NewPCG(11, 12))
		for _, c := range []dotGeneralCase{
			{lhsDims: []int{96, 40}, rhsDims: []int{40, 24}, lhsContracting: []int{1}, rhsContracting: []int{0}},
			{lhsDims: []int{64, 128}, rhsDims: []int{128, 16}, lhsContracting: []int{1}, rhsContracting: []int{0}},
			{lhsDims: []int{130, 7}, rhsDims: []int{7, 200}, lhsContracting: []int{1}, rhsContracting: []int{0}},
			{lhsDims: []int{2, 48, 40}, rhsDims: []int{40, 65}, lhsContracting: []int{2}, rhsContracting: []int{0}},
			{lhsDims: []int{1030, 24}, rhsDims: []int{100, 24}, lhsContracting: []int{1}, rhsContracting: []int{1}},
			// A weights gradient whose B (2048 × 128) is summed in runs on the tiles.
			{lhsDims: []int{2048, 20}, rhsDims: []int{2048, 128}, lhsContracting: []int{0}, rhsContracting: []int{0}},
		} {
			checkAgainstSimplego(t, backend, rng, dtypes.Float32, c)
		}
	})
}

// TestTilesReach: the tiles read A through int32 offsets, so a transposed A whose terms lie 2³¹ elements
// or more apart stays off them, whatever the kernel choice; plain A steps one element per term.
func TestTilesReach(t *testing.T) {
	for _, tc := range []struct {
		name string
		g    gemmShape
		want bool
	}{
		{"weights gradient", gemmShape{batch: 1, m: 128, n: 128, k: 2048, transA: true}, true},
		{"transposed A past 2³¹ elements", gemmShape{batch: 1, m: 1 << 11, n: 8, k: 1<<20 + 1, transA: true}, false},
		{"transposed A at the limit", gemmShape{batch: 1, m: 1 << 11, n: 8, k: 1<<20 + 1, transA: true, ldA: 2047}, true},
		{"plain A, long rows", gemmShape{batch: 1, m: 8, n: 8, k: 1 << 30}, true},
		{"empty sum", gemmShape{batch: 1, m: 8, n: 8, k: 0, transA: true}, true},
	} {
		assert.Equal(t, tc.want, tilesReach(tc.g), tc.name)
		if !tc.want {
			assert.False(t, onTiles(tc.g), "%s: never on the tiles", tc.name)
		}
	}
}
