package schedule_test

import (
	"fmt"

	"github.com/goaccel/goaccel/schedule"
)

// Cosine: 2 warm-up steps to 0.1, then half a cosine down to 0 over a job of 6 optimizer steps.
func ExampleCosine() {
	rate := schedule.Cosine(0.1, 2)(6)
	for step := range int64(6) {
		fmt.Printf("%.4f ", rate(step))
	}
	fmt.Println()
	// Output: 0.0000 0.0500 0.1000 0.0854 0.0500 0.0146
}

// Linear: the same warm-up, then a straight line down to 0.
func ExampleLinear() {
	rate := schedule.Linear(0.1, 2)(6)
	for step := range int64(6) {
		fmt.Printf("%.4f ", rate(step))
	}
	fmt.Println()
	// Output: 0.0000 0.0500 0.1000 0.0750 0.0500 0.0250
}

// MinRate ends the decay at a floor instead of 0.
func ExampleMinRate() {
	rate := schedule.Cosine(0.1, 0, schedule.MinRate(0.01))(4)
	fmt.Printf("%.4f %.4f\n", rate(0), rate(4))
	// Output: 0.1000 0.0100
}

// InExamples: sized in examples, a schedule gives the rate of the share of the job seen, whatever the
// examples per step. A job of 64 examples with its warm-up over the first quarter: at 40 examples
// (62.5%) the rate is the same for a run of 4 examples per step and one of 16.
func ExampleInExamples() {
	sized := schedule.Cosine(0.1, 0, schedule.WarmupRatio(0.25))
	for _, perStep := range []int64{4, 16} {
		rate := sized(64, schedule.InExamples(perStep))
		fmt.Printf("%d per step: %.4f %.4f %.4f\n", perStep, rate(8), rate(16), rate(40))
	}
	// Output:
	// 4 per step: 0.0500 0.1000 0.0500
	// 16 per step: 0.0500 0.1000 0.0500
}
