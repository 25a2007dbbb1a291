package accel_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/goaccel/goaccel/accel"
)

// Log writes the main process's metrics to its trackers; a checkpoint remembers how many records were
// logged before it, so a resumed run rewrites its logs without the records it will log again.
func ExampleAccelerator_Log() {
	dir, _ := os.MkdirTemp("", "goaccel-log")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "log.jsonl")
	acc, _ := accel.New(accel.WithTrackers(accel.NewJSONLinesTracker(path)))
	for step := int64(1); step <= 3; step++ {
		if err := acc.Log(step, map[string]float64{"loss": 1 / float64(step)}); err != nil {
			fmt.Println(err)
		}
	}
	_ = acc.Close()
	data, _ := os.ReadFile(path)
	fmt.Print(string(data))
	// Output:
	// {"step":1,"loss":1}
	// {"step":2,"loss":0.5}
	// {"step":3,"loss":0.3333333333333333}
}

// WithTrackers sets the trackers Log writes to: here a CSV table and a JSON Lines file of the same steps.
func ExampleWithTrackers() {
	dir, _ := os.MkdirTemp("", "goaccel-log")
	defer os.RemoveAll(dir)
	acc, _ := accel.New(accel.WithTrackers(accel.NewCSVTracker(filepath.Join(dir, "log.csv")),
		accel.NewJSONLinesTracker(filepath.Join(dir, "log.jsonl"))))
	_ = acc.Log(1, map[string]float64{"loss": 0.5})
	_ = acc.Close()
	for _, name := range []string{"log.csv", "log.jsonl"} {
		data, _ := os.ReadFile(filepath.Join(dir, name))
		fmt.Printf("%s:\n%s", name, data)
	}
	// Output:
	// log.csv:
	// step,loss
	// 1,0.5
	// log.jsonl:
	// {"step":1,"loss":0.5}
}

// A CSV tracker adds a column when a metric first appears, leaving earlier rows' cells empty.
func ExampleNewCSVTracker() {
	dir, _ := os.MkdirTemp("", "goaccel-log")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "log.csv")
	tracker := accel.NewCSVTracker(path)
	_ = tracker.Log(1, map[string]float64{"loss": 0.9})
	_ = tracker.Log(2, map[string]float64{"loss": 0.7, "eval_accuracy": 0.8})
	_ = tracker.Close()
	data, _ := os.ReadFile(path)
	fmt.Print(string(data))
	// Output:
	// step,loss,eval_accuracy
	// 1,0.9,
	// 2,0.7,0.8
}

// Resume keeps the records logged before a checkpoint: what LoadState does with every tracker.
func ExampleNewJSONLinesTracker() {
	dir, _ := os.MkdirTemp("", "goaccel-log")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "log.jsonl")
	first := accel.NewJSONLinesTracker(path)
	for step := int64(1); step <= 4; step++ {
		_ = first.Log(step, map[string]float64{"loss": float64(step)})
	}
	_ = first.Close()
	resumed := accel.NewJSONLinesTracker(path)
	_ = resumed.Resume(2) // the checkpoint was taken after two records
	_ = resumed.Log(3, map[string]float64{"loss": 30})
	_ = resumed.Close()
	data, _ := os.ReadFile(path)
	fmt.Print(string(data))
	// Output:
	// {"step":1,"loss":1}
	// {"step":2,"loss":2}
	// {"step":3,"loss":30}
}

// PadAcrossProcesses pads the first axis to the largest any process has; on one process nothing changes.
// GatherUneven gathers such tensors without the padding.
func ExampleAccelerator_PadAcrossProcesses() {
	acc, _ := accel.New()
	defer acc.Close()
	t := tensors.FromValue([][]float32{{1, 2}, {3, 4}})
	padded, rows, err := acc.PadAcrossProcesses(t, -1)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(padded.Value(), "rows per process:", rows)
	// Output:
	// [[1 2] [3 4]] rows per process: [2]
}

// GatherUneven gathers per-process metrics whose first dimension differs (variable-length batches),
// ordered by process.
func ExampleAccelerator_GatherUneven() {
	acc, _ := accel.New()
	defer acc.Close()
	all, err := acc.GatherUneven(tensors.FromValue([]int32{7, 8, 9}))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(all.Value())
	// Output:
	// [7 8 9]
}

// MeanOverRanks logs the mean of every rank's values (on one process, its own values). Every rank calls
// Log then, with the same metric names.
func ExampleMeanOverRanks() {
	dir, _ := os.MkdirTemp("", "goaccel-log")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "log.jsonl")
	acc, _ := accel.New(accel.WithTrackers(accel.NewJSONLinesTracker(path)))
	if err := acc.Log(1, map[string]float64{"loss": 0.25}, accel.MeanOverRanks()); err != nil {
		fmt.Println(err)
	}
	_ = acc.Close()
	data, _ := os.ReadFile(path)
	fmt.Print(string(data))
	// Output:
	// {"step":1,"loss":0.25}
}
