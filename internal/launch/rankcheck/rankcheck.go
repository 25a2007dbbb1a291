// Package rankcheck is a process's side of `accel launch --check` (launch.Check): it runs inside every
// process of the check job, on the job's communicator, so it is the one part of the launcher that links the
// collective engines; package launch itself starts processes and reads their report.
package rankcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/internal/launch"
)

// identitySize is the bytes of one process's identity in the check's all-gather.
const identitySize = 2048

// Run is a process's side of launch.Check: it runs in every process of the job, exchanges its host name and
// info with the others, and, when every process runs the same build, times float32 all-reduces of
// launch.CheckSizes (checking their sums; a job of one process has nothing to time); then rank 0 writes the report as one line to out. It returns an error
// when a collective fails or a sum is wrong; processes that run different builds are for the launcher to
// judge, and skip the all-reduces.
func Run(comm *backends.Communicator, info launch.CheckInfo, out io.Writer) error {
	host, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("launch: check: %w", err)
	}
	self := launch.RankCheck{Rank: comm.Rank(), Host: host, CheckInfo: launch.CheckInfo{
		GoaccelVersion: truncate(info.GoaccelVersion, 400), MPILibrary: truncate(info.MPILibrary, 400)}}
	record, err := json.Marshal(self)
	if err != nil {
		return fmt.Errorf("launch: check: %w", err)
	}
	send := make([]uint8, identitySize)
	copy(send, record)
	all := make([]uint8, identitySize*comm.Size())
	if err := comm.AllGather(backends.BufferOf(send), backends.BufferOf(all)); err != nil {
		return fmt.Errorf("launch: check: exchanging the processes' hosts and builds: %w", err)
	}
	report := launch.CheckReport{Ranks: make([]launch.RankCheck, comm.Size())}
	for r := range comm.Size() {
		chunk := bytes.TrimRight(all[r*identitySize:(r+1)*identitySize], "\x00")
		if err := json.Unmarshal(chunk, &report.Ranks[r]); err != nil {
			return fmt.Errorf("launch: check: rank %d's identity: %w", r, err)
		}
	}
	// Every process compares the same records, so all skip together: different MPI builds may not
	// even agree on an all-reduce.
	if launch.Mismatches(report.Ranks) == nil && comm.Size() > 1 {
		for _, size := range launch.CheckSizes {
			a, err := timeAllReduce(comm, size)
			if err != nil {
				return err
			}
			report.AllReduces = append(report.AllReduces, a)
		}
	}
	if comm.Rank() != 0 {
		return nil
	}
	line, err := json.Marshal(report)
	if err != nil {
		return fmt.Errorf("launch: check: %w", err)
	}
	_, err = fmt.Fprintf(out, "%s%s\n", launch.CheckLinePrefix, line)
	return err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// timeAllReduce runs one untimed and size.Runs timed all-reduces, each between barriers, and returns the
// median over runs of the slowest process's time.
func timeAllReduce(comm *backends.Communicator, size launch.CheckSize) (launch.AllReduceCheck, error) {
	n, rank := comm.Size(), comm.Rank()
	buf := make([]float32, size.Bytes/4)
	mine := make([]float64, size.Runs)
	for run := -1; run < size.Runs; run++ {
		for i := range buf {
			buf[i] = float32(rank + i%7)
		}
		if err := comm.Barrier(); err != nil {
			return launch.AllReduceCheck{}, fmt.Errorf("launch: check: %w", err)
		}
		start := time.Now()
		if err := comm.AllReduceSum(backends.BufferOf(buf)); err != nil {
			return launch.AllReduceCheck{}, fmt.Errorf("launch: check: all-reduce of %s: %w", launch.ByteSize(size.Bytes), err)
		}
		if run >= 0 {
			mine[run] = time.Since(start).Seconds()
		}
		for i, v := range buf {
			if want := float32(n*(n-1)/2 + n*(i%7)); v != want {
				return launch.AllReduceCheck{}, fmt.Errorf("launch: check: all-reduce of %s on rank %d: element %d is %g, want %g",
					launch.ByteSize(size.Bytes), rank, i, v, want)
			}
		}
	}
	all := make([]float64, n*size.Runs)
	if err := comm.AllGather(backends.BufferOf(mine), backends.BufferOf(all)); err != nil {
		return launch.AllReduceCheck{}, fmt.Errorf("launch: check: %w", err)
	}
	slowest := make([]float64, size.Runs)
	for run := range size.Runs {
		for r := range n {
			slowest[run] = max(slowest[run], all[r*size.Runs+run])
		}
	}
	slices.Sort(slowest)
	median := slowest[len(slowest)/2]
	if len(slowest)%2 == 0 {
		median = (slowest[len(slowest)/2-1] + median) / 2
	}
	a := launch.AllReduceCheck{Bytes: size.Bytes, Seconds: median, Runs: size.Runs}
	if median > 0 {
		a.AlgorithmBandwidth = float64(size.Bytes) / median
		a.BusBandwidth = a.AlgorithmBandwidth * 2 * float64(n-1) / float64(n)
	}
	return a, nil
}
