package accumulate_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goaccel/goaccel/accumulate"
)

func param(name string, dtype dtypes.DType, dims ...int) accumulate.Param {
	return accumulate.Param{Name: name, Shape: shapes.Make(dtype, dims...)}
}

// f32s returns n float32 parameters of elems elements each (4·elems bytes), named p0, p1, ….
func f32s(n, elems int) []accumulate.Param {
	params := make([]accumulate.Param, n)
	for i := range params {
		params[i] = param(fmt.Sprintf("p%d", i), dtypes.Float32, elems)
	}
	return params
}

// layout is a plan's buckets written as the parameter indices of their slots, in slot order.
func layout(plan accumulate.Plan) [][]int {
	out := make([][]int, len(plan.Buckets))
	for b, bucket := range plan.Buckets {
		out[b] = []int{}
		for _, s := range bucket.Slots {
			out[b] = append(out[b], s.Param)
		}
	}
	return out
}

// requireValidPlan checks the invariants every plan must satisfy, whatever its caps.
func requireValidPlan(t *testing.T, params []accumulate.Param, plan accumulate.Plan) {
	t.Helper()
	require.Equal(t, params, plan.Params)
	require.Len(t, plan.Where, len(params))
	seen := make([]int, len(params))
	for b, bucket := range plan.Buckets {
		require.NotEmpty(t, bucket.Slots, "bucket %d is empty", b)
		offset := 0
		for s, slot := range bucket.Slots {
			require.GreaterOrEqual(t, slot.Param, 0)
			require.Less(t, slot.Param, len(params))
			p := params[slot.Param]
			seen[slot.Param]++
			assert.Equal(t, bucket.DType, p.Shape.DType, "bucket %d holds %q of another dtype", b, p.Name)
			assert.Equal(t, offset, slot.Offset, "bucket %d slot %d: offsets must be contiguous", b, s)
			assert.Equal(t, p.Shape.Size(), slot.Size, "bucket %d slot %d: size of %q", b, s, p.Name)
			assert.Equal(t, [2]int{b, s}, plan.Where[slot.Param], "Where of %q", p.Name)
			offset += slot.Size
		}
		assert.Equal(t, offset, bucket.Size, "bucket %d: size is the sum of its slots", b)
		assert.Equal(t, bucket.Size*bucket.DType.Size(), bucket.Bytes())
	}
	for i, n := range seen {
		assert.Equal(t, 1, n, "parameter %d (%q) must be in exactly one slot", i, params[i].Name)
	}
	// Per dtype, buckets in order and slots in order list the parameters in reverse registration order.
	byDType := map[dtypes.DType][]int{}
	for _, bucket := range plan.Buckets {
		for _, s := range bucket.Slots {
			byDType[bucket.DType] = append(byDType[bucket.DType], s.Param)
		}
	}
	for dtype, order := range byDType {
		assert.True(t, slices.IsSortedFunc(order, func(a, b int) int { return b - a }),
			"%s parameters must be planned in reverse registration order, got %v", dtype, order)
	}
}

func TestNewPlanLayout(t *testing.T) {
	const mb = 1 << 20
	tests := []struct {
		name            string
		params          []accumulate.Param
		first, capBytes int64
		want            [][]int
		wantDTypes      []dtypes.DType // nil: all float32
	}{
		{name: "no parameters", params: nil, first: 64, capBytes: 64, want: [][]int{}},
		{name: "one parameter", params: f32s(1, 4), first: 64, capBytes: 64, want: [][]int{{0}}},
		{name: "all fit in the first bucket", params: f32s(3, 4), first: 64, capBytes: 128, want: [][]int{{2, 1, 0}}},
		{name: "exactly the first cap fits", params: f32s(2, 4), first: 32, capBytes: 1000, want: [][]int{{1, 0}}},
		{name: "first cap splits, later cap is larger", params: f32s(4, 4), first: 32, capBytes: 1000,
			want: [][]int{{3, 2}, {1, 0}}},
		{name: "later buckets use the later cap", params: f32s(6, 4), first: 16, capBytes: 32,
			want: [][]int{{5}, {4, 3}, {2, 1}, {0}}},
		{name: "parameter larger than the cap gets its own bucket",
			params: []accumulate.Param{param("a", dtypes.Float32, 4), param("big", dtypes.Float32, 25),
				param("c", dtypes.Float32, 4)},
			first: 32, capBytes: 32, want: [][]int{{2}, {1}, {0}}},
		{name: "first parameter larger than the first cap",
			params: []accumulate.Param{param("a", dtypes.Float32, 4), param("big", dtypes.Float32, 25)},
			first:  32, capBytes: 64, want: [][]int{{1}, {0}}},
		{name: "several oversized parameters in a row",
			params: []accumulate.Param{param("a", dtypes.Float32, 100), param("b", dtypes.Float32, 100),
				param("c", dtypes.Float32, 1)},
			first: 16, capBytes: 16, want: [][]int{{2}, {1}, {0}}},
		{name: "scalars", params: []accumulate.Param{param("s0", dtypes.Float32), param("s1", dtypes.Float32),
			param("s2", dtypes.Float32)}, first: 8, capBytes: 8, want: [][]int{{2, 1}, {0}}},
		{name: "dtypes get separate buckets and separate first caps",
			params: []accumulate.Param{param("a32", dtypes.Float32, 4), param("a64", dtypes.Float64, 4),
				param("b32", dtypes.Float32, 4), param("b64", dtypes.Float64, 4)},
			first: 32, capBytes: 64, want: [][]int{{3}, {2, 0}, {1}},
			wantDTypes: []dtypes.DType{dtypes.Float64, dtypes.Float32, dtypes.Float64}},
		{name: "float64 fills by bytes, not elements",
			params: []accumulate.Param{param("a", dtypes.Float64, 4), param("b", dtypes.Float64, 4),
				param("c", dtypes.Float64, 4)},
			first: 64, capBytes: 64, want: [][]int{{2, 1}, {0}},
			wantDTypes: []dtypes.DType{dtypes.Float64, dtypes.Float64}},
		{name: "non-positive first cap means the 1 MB default", params: f32s(3, mb/8), first: 0, capBytes: 1 << 30,
			want: [][]int{{2, 1}, {0}}},
		{name: "negative first cap means the 1 MB default", params: f32s(3, mb/8), first: -5, capBytes: 1 << 30,
			want: [][]int{{2, 1}, {0}}},
		{name: "first cap above the cap is cut to the cap", params: f32s(4, mb/8), first: 2 * mb, capBytes: 3 * mb / 2,
			want: [][]int{{3, 2, 1}, {0}}},
		{name: "default caps", params: f32s(10, mb/8), first: accumulate.DefaultFirstBucketBytes,
			capBytes: accumulate.DefaultBucketCapBytes, want: [][]int{{9, 8}, {7, 6, 5, 4, 3, 2, 1, 0}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := accumulate.NewPlan(tc.params, tc.first, tc.capBytes)
			require.NoError(t, err)
			requireValidPlan(t, tc.params, plan)
			assert.Equal(t, tc.want, layout(plan))
			wantDTypes := tc.wantDTypes
			if wantDTypes == nil {
				wantDTypes = slices.Repeat([]dtypes.DType{dtypes.Float32}, len(tc.want))
			}
			gotDTypes := make([]dtypes.DType, len(plan.Buckets))
			var total int64
			for b, bucket := range plan.Buckets {
				gotDTypes[b] = bucket.DType
				total += int64(bucket.Bytes())
			}
			assert.Equal(t, wantDTypes, gotDTypes)
			assert.Equal(t, total, plan.TotalBytes())
		})
	}
}

// TestNewPlanRespectsCaps checks, over many shapes, that no bucket exceeds its cap unless it holds a single
// parameter that alone is larger.
func TestNewPlanRespectsCaps(t *testing.T) {
	sizes := []int{1, 7, 3, 40, 2, 2, 9, 100, 1, 5, 16, 16, 33}
	for _, caps := range [][2]int64{{8, 8}, {16, 64}, {64, 64}, {40, 200}, {400, 1000}, {1, 1 << 20}} {
		t.Run(fmt.Sprintf("first=%d,cap=%d", caps[0], caps[1]), func(t *testing.T) {
			var params []accumulate.Param
			for i, n := range sizes {
				dtype := dtypes.Float32
				if i%3 == 0 {
					dtype = dtypes.Float64
				}
				params = append(params, param(fmt.Sprintf("v%d", i), dtype, n))
			}
			plan, err := accumulate.NewPlan(params, caps[0], caps[1])
			require.NoError(t, err)
			requireValidPlan(t, params, plan)
			firstSeen := map[dtypes.DType]bool{}
			nextOfDType := func(b int) (accumulate.Bucket, bool) {
				for _, later := range plan.Buckets[b+1:] {
					if later.DType == plan.Buckets[b].DType {
						return later, true
					}
				}
				return accumulate.Bucket{}, false
			}
			for b, bucket := range plan.Buckets {
				limit := caps[1]
				if !firstSeen[bucket.DType] {
					limit = caps[0]
					firstSeen[bucket.DType] = true
				}
				if len(bucket.Slots) > 1 {
					assert.LessOrEqual(t, int64(bucket.Bytes()), limit, "bucket %d exceeds its cap", b)
				}
				// Greedy: a bucket is closed only when the next parameter of its dtype would overflow it.
				if next, ok := nextOfDType(b); ok {
					assert.Greater(t, int64(bucket.Bytes()+next.Slots[0].Size*bucket.DType.Size()), limit,
						"bucket %d was closed although the next parameter fits", b)
				}
			}
		})
	}
}

func TestNewPlanErrors(t *testing.T) {
	ok := param("ok", dtypes.Float32, 3)
	tests := []struct {
		name            string
		params          []accumulate.Param
		first, capBytes int64
		wantContains    []string
	}{
		{name: "int32 variable", params: []accumulate.Param{ok, param("layer/step_count", dtypes.Int32, 1)},
			first: 64, capBytes: 64, wantContains: []string{`"layer/step_count"`, "Int32"}},
		{name: "float16 variable", params: []accumulate.Param{param("half/weights", dtypes.Float16, 2, 2), ok},
			first: 64, capBytes: 64, wantContains: []string{`"half/weights"`, "Float16"}},
		{name: "bool variable", params: []accumulate.Param{param("mask", dtypes.Bool, 2)},
			first: 64, capBytes: 64, wantContains: []string{`"mask"`}},
		{name: "zero cap", params: []accumulate.Param{ok}, first: 64, capBytes: 0, wantContains: []string{"0 bytes"}},
		{name: "negative cap", params: []accumulate.Param{ok}, first: 64, capBytes: -1,
			wantContains: []string{"-1 bytes"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := accumulate.NewPlan(tc.params, tc.first, tc.capBytes)
			require.Error(t, err)
			for _, s := range tc.wantContains {
				assert.Contains(t, err.Error(), s)
			}
			assert.Empty(t, plan.Buckets)
		})
	}
}

// TestNewPlanKeepsItsOwnParams: a caller reusing its slice must not change a plan already handed out.
func TestNewPlanKeepsItsOwnParams(t *testing.T) {
	params := f32s(2, 3)
	plan, err := accumulate.NewPlan(params, 64, 64)
	require.NoError(t, err)
	params[0] = param("renamed", dtypes.Float32, 99)
	assert.Equal(t, "p0", plan.Params[0].Name)
	assert.Equal(t, 3, plan.Params[0].Shape.Size())
}

func TestPlanSignature(t *testing.T) {
	base := []accumulate.Param{param("w", dtypes.Float32, 2, 3), param("b", dtypes.Float32, 3),
		param("w64", dtypes.Float64, 4)}
	signature := func(params []accumulate.Param, first, capBytes int64) []string {
		plan, err := accumulate.NewPlan(params, first, capBytes)
		require.NoError(t, err)
		return plan.Signature()
	}
	baseSig := signature(base, 1024, 1024)
	assert.Equal(t, baseSig, signature(slices.Clone(base), 1024, 1024), "the signature must be deterministic")
	assert.Len(t, baseSig, 3+2, "one line per parameter and per bucket")

	changed := func(edit func(p []accumulate.Param)) []accumulate.Param {
		p := slices.Clone(base)
		edit(p)
		return p
	}
	variants := map[string][]string{
		"shape":      signature(changed(func(p []accumulate.Param) { p[0].Shape = shapes.Make(dtypes.Float32, 3, 2) }), 1024, 1024),
		"size":       signature(changed(func(p []accumulate.Param) { p[1].Shape = shapes.Make(dtypes.Float32, 4) }), 1024, 1024),
		"name":       signature(changed(func(p []accumulate.Param) { p[1].Name = "bias" }), 1024, 1024),
		"dtype":      signature(changed(func(p []accumulate.Param) { p[2].Shape = shapes.Make(dtypes.Float32, 4) }), 1024, 1024),
		"order":      signature(changed(func(p []accumulate.Param) { p[0], p[1] = p[1], p[0] }), 1024, 1024),
		"bucket cap": signature(base, 16, 16),
	}
	for what, sig := range variants {
		assert.NotEqual(t, baseSig, sig, "changing the %s must change the signature", what)
	}
}
