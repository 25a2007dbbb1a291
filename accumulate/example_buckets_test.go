package accumulate_test

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"

	"github.com/goaccel/goaccel/accumulate"
	"github.com/goaccel/goaccel/backends"
)

// EachAccumulator reads and changes the bucket accumulators in place: here the sum of squares of the
// gradients, then every value halved, as clipping by norm does between a sync and the optimizer's step.
func ExampleReducer_EachAccumulator() {
	plan, _ := accumulate.NewPlan([]accumulate.Param{{Name: "w", Shape: shapes.Make(dtypes.Float32, 3)}}, 0, 1<<20)
	bucket := context.New().VariableWithValue("bucket_000", []float32{3, 4, 0})
	reducer := accumulate.NewReducer(backends.NewSingle(), plan, accumulate.WithAccumulators([]*context.Variable{bucket}))
	var sumSquares float32
	noFloat64 := func([]float64) {} // this model has float32 parameters only
	_ = reducer.EachAccumulator(func(values []float32) {
		for _, g := range values {
			sumSquares += g * g
		}
	}, noFloat64)
	_ = reducer.EachAccumulator(func(values []float32) {
		for i := range values {
			values[i] /= 2
		}
	}, noFloat64)
	value, _ := bucket.Value()
	fmt.Println(sumSquares, tensors.MustCopyFlatData[float32](value))
	// Output: 25 [1.5 2 0]
}
