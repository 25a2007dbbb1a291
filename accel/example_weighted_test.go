package accel_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/goaccel/goaccel/accel"
)

// WeightedMean averages a per-example mean over the processes, weighted by each one's examples: an
// epoch's loss over every example whatever the size of each process's batches. Every process calls it.
func ExampleAccelerator_WeightedMean() {
	acc, _ := accel.New()
	defer acc.Close()
	// This process trained a batch of 8 examples at a mean loss of 0.5 and a short one of 2 at 1.
	lossSum, examples := 0.5*8+1.0*2, 10.0
	loss, total, err := acc.WeightedMean(lossSum/examples, examples)
	fmt.Println(loss, total, err)
	// Output:
	// 0.6 10 <nil>
}

// WeightedBy logs the mean of every rank's values weighted by its examples (on one process, its own
// values). Every rank calls Log then, with the same metric names.
func ExampleWeightedBy() {
	dir, _ := os.MkdirTemp("", "goaccel-log")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "log.jsonl")
	acc, _ := accel.New(accel.WithTrackers(accel.NewJSONLinesTracker(path)))
	if err := acc.Log(1, map[string]float64{"loss": 0.25}, accel.WeightedBy(32)); err != nil {
		fmt.Println(err)
	}
	_ = acc.Close()
	data, _ := os.ReadFile(path)
	fmt.Print(string(data))
	// Output:
	// {"step":1,"loss":0.25}
}
