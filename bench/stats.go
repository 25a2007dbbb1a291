package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Series is the repeated measurement of one variant: each sample is the mean time of one operation over a
// timed batch of operations. Samples of compared variants are taken interleaved (A B A B …), so slow
// phases of a shared machine hit every variant alike.
type Series struct {
	// Name is the benchstat name without the "Benchmark" prefix, for example "AllReduce/impl=raw/size=1MB/ranks=2".
	Name string `json:"name"`
	// Iters is the number of operations timed in each sample.
	Iters int `json:"iters"`
	// Seconds holds one entry per sample: seconds per operation.
	Seconds []float64 `json:"seconds"`
	// Bytes is the payload of one operation, for throughput (0: none).
	Bytes int64 `json:"bytes,omitempty"`
	// Extra are further per-operation figures (unit → value), printed as benchstat metrics: collective
	// calls per operation and the like. They are the same for every sample.
	Extra map[string]float64 `json:"extra,omitempty"`
}

// Median is the median seconds per operation.
func (s Series) Median() float64 { return quantile(s.Seconds, 0.5) }

// Spread is half the interquartile range relative to the median: the ±x% a reader can expect between
// runs. It ignores the extremes, which on a shared machine are mostly other people's work.
func (s Series) Spread() float64 {
	m := s.Median()
	if m == 0 {
		return 0
	}
	return (quantile(s.Seconds, 0.75) - quantile(s.Seconds, 0.25)) / 2 / m
}

// MinMax are the fastest and slowest samples.
func (s Series) MinMax() (float64, float64) {
	if len(s.Seconds) == 0 {
		return 0, 0
	}
	return slices.Min(s.Seconds), slices.Max(s.Seconds)
}

// quantile interpolates linearly between order statistics (type 7, R's default).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (pos-float64(lo))*(s[hi]-s[lo])
}

// BenchstatLines renders the series as benchmark result lines, one per sample, which benchstat
// aggregates: "BenchmarkName  iters  123 ns/op  45.6 MB/s  …".
func (s Series) BenchstatLines() []string {
	lines := make([]string, 0, len(s.Seconds))
	units := make([]string, 0, len(s.Extra))
	for u := range s.Extra {
		units = append(units, u)
	}
	slices.Sort(units)
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

// Ratio compares two medians: how many times longer b takes than a. A ratio above 1 means a is faster.
func Ratio(a, b Series) float64 { return b.Median() / a.Median() }

// formatDuration prints seconds with a unit suited to their size.
func formatDuration(sec float64) string {
	d := time.Duration(sec * 1e9)
	switch {
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
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMB", float64(n)/(1<<20))
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
