package rankcheck_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/launch"
	"github.com/goaccel/goaccel/internal/launch/rankcheck"
)

// Run in each of two goroutine ranks (a real job runs it in each MPI process: `accel check-rank`):
// rank 0 writes the report, with every process's host and build and the all-reduces' times.
func ExampleRun() {
	comms, err := backends.NewInProcessGroup(2)
	if err != nil {
		panic(err)
	}
	var out bytes.Buffer
	var wg sync.WaitGroup
	for _, comm := range comms {
		wg.Go(func() {
			if err := rankcheck.Run(comm, launch.CheckInfo{GoaccelVersion: "0.3.0", MPILibrary: "in-process"}, &out); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	line, _ := strings.CutPrefix(strings.TrimSpace(out.String()), "goaccel-check: ")
	var report launch.CheckReport
	if err := json.Unmarshal([]byte(line), &report); err != nil {
		panic(err)
	}
	fmt.Println(len(report.Ranks), "ranks,", report.Ranks[1].GoaccelVersion, report.Ranks[1].MPILibrary)
	for _, a := range report.AllReduces {
		fmt.Println(a.Bytes, "bytes,", a.Runs, "runs, bandwidth measured:", a.BusBandwidth > 0)
	}
	// Output:
	// 2 ranks, 0.3.0 in-process
	// 1048576 bytes, 5 runs, bandwidth measured: true
	// 16777216 bytes, 3 runs, bandwidth measured: true
}
