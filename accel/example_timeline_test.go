package accel_test

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/goaccel/goaccel/accel"
	"github.com/goaccel/goaccel/internal/testing/testmodel"
	"github.com/goaccel/goaccel/internal/traceevent"
)

// WithTimeline writes a trace of the job at Close. Here one process, two micro-batches per optimizer
// step: the training track holds each micro-batch with its compiled pass inside, the second marked as the
// one that syncs, then the optimizer step.
func ExampleWithTimeline() {
	dir, _ := os.MkdirTemp("", "timeline")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "timeline.json")
	acc, err := accel.New(accel.WithBackend("go"), accel.WithTimeline(path), accel.WithGradientAccumulationSteps(2),
		accel.WithOutput(io.Discard))
	if err != nil {
		fmt.Println(err)
		return
	}
	inputs, labels := testmodel.Data(4, 1)
	if _, err := (testmodel.Run{Kind: testmodel.SGD, Inputs: inputs, Labels: labels, BatchSize: 2}).Train(acc); err != nil {
		fmt.Println(err)
	}
	if err := acc.Close(); err != nil {
		fmt.Println(err)
	}
	f, err := traceevent.ReadFile(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	var training []traceevent.Event
	for _, e := range f.TraceEvents {
		switch {
		case e.Name == "process_name":
			fmt.Println("row:", e.Args["name"])
		case e.Ph == traceevent.PhaseComplete && e.Tid == 1:
			training = append(training, e)
		}
	}
	slices.SortStableFunc(training, func(a, b traceevent.Event) int {
		if a.Ts != b.Ts {
			return map[bool]int{true: -1, false: 1}[a.Ts < b.Ts]
		}
		return map[bool]int{true: -1, false: 1}[a.Dur > b.Dur]
	})
	for _, e := range training {
		fmt.Println(e.Name)
	}
	// Output:
	// row: rank 0
	// micro-batch 1
	// forward+backward 1
	// micro-batch 2 (syncs)
	// forward+backward 2
	// optimizer step 1
}
