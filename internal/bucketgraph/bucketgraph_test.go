package bucketgraph_test

import (
	"fmt"
	"sync"
	"testing"

	gomlxbackends "github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/cpu"
	_ "github.com/goaccel/goaccel/cpu/kernels" // goaccel's kernels, as accel links them
	"github.com/goaccel/goaccel/internal/bucketgraph"
)

var (
	pureGoOnce    sync.Once
	pureGoBackend gomlxbackends.Backend
	pureGoErr     error
)

// pureGo is the pure-Go compute backend, shared by the tests of this package. It executes ops one at a
// time: SimpleGo's parallel executor (GoMLX v0.26.0, simplego/exec.go) reads its use counters without its
// lock, which `go test -race` reports although the results are right; these tiny graphs gain nothing from
// parallel execution anyway.
func pureGo(t *testing.T) gomlxbackends.Backend {
	t.Helper()
	pureGoOnce.Do(func() {
		pureGoBackend, pureGoErr = cpu.New(cpu.Config{Backend: cpu.PureGo + ":ops_sequential"})
	})
	require.NoError(t, pureGoErr)
	return pureGoBackend
}

// distinctTensor returns a tensor of shape p.Shape whose elements are all different (and different from
// other parameters' through base), as float32 or float64.
func distinctTensor(t *testing.T, p accumulate.Param, base float64) (*tensors.Tensor, []float64) {
	t.Helper()
	n := p.Shape.Size()
	values := make([]float64, n)
	for i := range values {
		values[i] = base + float64(i) + 0.25
	}
	switch p.Shape.DType {
	case dtypes.Float32:
		data := make([]float32, n)
		for i, v := range values {
			data[i] = float32(v)
		}
		return tensors.FromFlatDataAndDimensions(data, p.Shape.Dimensions...), values
	case dtypes.Float64:
		return tensors.FromFlatDataAndDimensions(values, p.Shape.Dimensions...), values
	}
	t.Fatalf("unexpected dtype %s", p.Shape.DType)
	return nil, nil
}

// flatValues reads a float32 or float64 tensor as float64s.
func flatValues(t *testing.T, tensor *tensors.Tensor) []float64 {
	t.Helper()
	switch tensor.DType() {
	case dtypes.Float32:
		data := tensors.MustCopyFlatData[float32](tensor)
		out := make([]float64, len(data))
		for i, v := range data {
			out[i] = float64(v)
		}
		return out
	case dtypes.Float64:
		return tensors.MustCopyFlatData[float64](tensor)
	}
	t.Fatalf("unexpected dtype %s", tensor.DType())
	return nil
}

func TestFlattenAndSplitRoundTrip(t *testing.T) {
	backend := pureGo(t)
	params := []accumulate.Param{
		param("dense0/weights", dtypes.Float32, 2, 3),
		param("dense0/biases", dtypes.Float32, 3),
		param("dense1/weights", dtypes.Float64, 3, 2),
		param("scale", dtypes.Float32),
		param("dense1/biases", dtypes.Float64, 2),
		param("conv/kernel", dtypes.Float32, 2, 1, 2),
	}
	tests := []struct {
		name            string
		first, capBytes int64
		minBuckets      int
	}{
		{name: "one bucket per dtype", first: 1 << 20, capBytes: 1 << 20, minBuckets: 2},
		{name: "small buckets", first: 8, capBytes: 24, minBuckets: 5},
		{name: "one parameter per bucket", first: 1, capBytes: 1, minBuckets: len(params)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := accumulate.NewPlan(params, tc.first, tc.capBytes)
			require.NoError(t, err)
			require.GreaterOrEqual(t, len(plan.Buckets), tc.minBuckets)

			inputs := make([]any, len(params))
			want := make([][]float64, len(params))
			for i, p := range params {
				inputs[i], want[i] = distinctTensor(t, p, float64(100*i))
			}
			exec, err := graph.NewExec(backend, func(grads []*graph.Node) []*graph.Node {
				flats := bucketgraph.Flatten(plan, grads)
				return append(flats, bucketgraph.Unflatten(plan, flats)...)
			})
			require.NoError(t, err)
			defer exec.Finalize()
			outputs, err := exec.Exec(inputs...)
			require.NoError(t, err)
			require.Len(t, outputs, len(plan.Buckets)+len(params))

			for b, bucket := range plan.Buckets {
				flat := outputs[b]
				assert.Equal(t, bucket.DType, flat.DType(), "bucket %d dtype", b)
				assert.Equal(t, []int{bucket.Size}, flat.Shape().Dimensions, "bucket %d is flat", b)
				var wantFlat []float64
				for _, s := range bucket.Slots {
					wantFlat = append(wantFlat, want[s.Param]...)
				}
				assert.Equal(t, wantFlat, flatValues(t, flat), "bucket %d holds its slots end to end", b)
			}
			for i, p := range params {
				got := outputs[len(plan.Buckets)+i]
				assert.True(t, p.Shape.Equal(got.Shape()), "%s: shape %s, want %s", p.Name, got.Shape(), p.Shape)
				assert.Equal(t, want[i], flatValues(t, got), "%s must round-trip exactly", p.Name)
			}
		})
	}
}

func TestFlattenAndSplitMisuse(t *testing.T) {
	backend := pureGo(t)
	params := []accumulate.Param{param("w", dtypes.Float32, 2, 2), param("b", dtypes.Float32, 2)}
	plan, err := accumulate.NewPlan(params, 1<<20, 1<<20)
	require.NoError(t, err)
	w := tensors.FromFlatDataAndDimensions([]float32{1, 2, 3, 4}, 2, 2)
	b := tensors.FromFlatDataAndDimensions([]float32{5, 6}, 2)
	wrongB := tensors.FromFlatDataAndDimensions([]float32{5, 6, 7}, 3)

	tests := []struct {
		name         string
		fn           func(in []*graph.Node) []*graph.Node
		args         []any
		wantContains string
	}{
		{name: "too few gradients", fn: func(in []*graph.Node) []*graph.Node { return bucketgraph.Flatten(plan, in[:1]) },
			args: []any{w, b}, wantContains: "1 gradients for a plan of 2 parameters"},
		{name: "wrong gradient shape", fn: func(in []*graph.Node) []*graph.Node { return bucketgraph.Flatten(plan, in) },
			args: []any{w, wrongB}, wantContains: `gradient of "b"`},
		{name: "wrong bucket count", fn: func(in []*graph.Node) []*graph.Node { return bucketgraph.Unflatten(plan, in) },
			args: []any{w, b}, wantContains: fmt.Sprintf("2 bucket nodes for a plan of %d buckets", len(plan.Buckets))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			exec, err := graph.NewExec(backend, tc.fn)
			require.NoError(t, err)
			defer exec.Finalize()
			// Graph-building code reports misuse by panicking (the prepared model recovers it into an error).
			var message string
			func() {
				defer func() { message = fmt.Sprint(recover()) }()
				_, err = exec.Exec(tc.args...)
			}()
			if err != nil {
				message = err.Error()
			}
			assert.Contains(t, message, tc.wantContains)
		})
	}
}

func param(name string, dtype dtypes.DType, dims ...int) accumulate.Param {
	return accumulate.Param{Name: name, Shape: shapes.Make(dtype, dims...)}
}
