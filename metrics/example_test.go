package metrics_test

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/metrics"
	"github.com/goaccel/goaccel/prepare"
)

// Scoring an evaluation loop: here the loader's inputs stand for a model's predictions (logits over 3
// classes), which model.Predict(batch.Inputs...) would return.
func ExampleNew() {
	acc, _ := accel.New()
	defer acc.Close()
	src, _ := prepare.TensorSource(
		[]*tensors.Tensor{tensors.FromValue([][]float32{{3, 1, 0}, {2, 1, 0}, {0, 5, 1}, {0, 0, 9}})},
		[]*tensors.Tensor{tensors.FromValue([][]int32{{0}, {1}, {1}, {2}})})
	loader, _ := acc.PrepareDataLoader(src, prepare.BatchSize(2))
	scores := metrics.New(acc, metrics.Accuracy(), metrics.TopK(2))
	for batch, err := range loader.All() {
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := scores.Update(batch.Inputs[0], batch); err != nil {
			fmt.Println(err)
			return
		}
	}
	results := scores.Results()
	fmt.Printf("accuracy %.2f, top-2 %.2f over %d examples\n", results["accuracy"], results["top_2_accuracy"], scores.Count())
	// Output: accuracy 0.75, top-2 1.00 over 4 examples
}
