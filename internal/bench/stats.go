package bench

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// series is the repeated measurement of one variant: each sample is the mean time of one operation over a
// timed batch of operations.
type series struct {
	// Name is the benchstat name without "Benchmark", for example "AllReduce/impl=mpi/size=1MB/ranks=2".
	Name  string
	Iters int // operations timed in each sample
	// Seconds holds one entry per sample: seconds per operation.
	Seconds []float64
	Bytes   int64 // payload of one operation, for throughput (0: none)
	// Extra are further per-operation figures (unit → value), printed as benchstat metrics.
	Extra map[string]float64 `json:",omitempty"`
}

func (s series) median() float64 { return quantile(s.Seconds, 0.5) }

// spread is half the interquartile range relative to the median: the ±x% a reader can expect between
// runs. It ignores the extremes, which on a shared machine are mostly other people's work.
func (s series) spread() float64 {
	m := s.median()
	if m == 0 {
		return 0
	}
	return (quantile(s.Seconds, 0.75) - quantile(s.Seconds, 0.25)) / 2 / m
}

func (s series) fastest() float64 {
	if len(s.Seconds) == 0 {
		return math.NaN()
	}
	return slices.Min(s.Seconds)
}

// quantile interpolates linearly between order statistics (type 7, R's default).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (pos-float64(lo))*(s[hi]-s[lo])
}

// benchstatLines renders the series as benchmark result lines, one per sample, which benchstat
// aggregates: "BenchmarkName  iters  123 ns/op  45.6 MB/s  …".
func (s series) benchstatLines() []string {
	units := slices.Sorted(maps.Keys(s.Extra))
	lines := make([]string, 0, len(s.Seconds))
	for _, sec := range s.Seconds {
		var b strings.Builder
		fmt.Fprintf(&b, "Benchmark%s \t%8d \t%12.0f ns/op", s.Name, s.Iters, sec*1e9)
		if s.Bytes > 0 && sec > 0 {
			fmt.Fprintf(&b, " \t%10.2f MB/s", float64(s.Bytes)/sec/1e6)
		}
		for _, u := range units {
			fmt.Fprintf(&b, " \t%g %s", s.Extra[u], u)
		}
		lines = append(lines, b.String())
	}
	return lines
}

// ratio compares two medians: how many times longer b takes than a. Above 1, a is faster.
func ratio(a, b series) float64 { return b.median() / a.median() }

// formatDuration prints seconds with a unit suited to their size.
func formatDuration(sec float64) string {
	switch d := time.Duration(sec * 1e9); {
	case d < time.Microsecond:
		return fmt.Sprintf("%.0f ns", sec*1e9)
	case d < time.Millisecond:
		return fmt.Sprintf("%.1f µs", sec*1e6)
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", sec*1e3)
	}
	return fmt.Sprintf("%.2f s", sec)
}

// formatBytes prints a size in binary units, as the sizes are chosen (64 KB = 65536 bytes).
func formatBytes(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMB", float64(n)/(1<<20))
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
