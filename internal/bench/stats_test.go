package bench

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSeriesStatistics(t *testing.T) {
	tests := []struct {
		name    string
		seconds []float64
		median  float64
		spread  float64
	}{
		{"odd", []float64{3, 1, 2}, 2, 0.25},
		{"even", []float64{4, 1, 3, 2}, 2.5, 0.3},
		{"constant", []float64{5, 5, 5}, 5, 0},
		{"outlier ignored by the spread", []float64{1, 1, 1, 1, 100}, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := series{Seconds: tt.seconds}
			assert.InDelta(t, tt.median, s.median(), 1e-12)
			assert.InDelta(t, tt.spread, s.spread(), 1e-12)
		})
	}
}

func TestRatio(t *testing.T) {
	fast, slow := series{Seconds: []float64{1, 1}}, series{Seconds: []float64{3, 3}}
	assert.InDelta(t, 3, ratio(fast, slow), 1e-12, "slow takes 3× as long as fast")
	assert.InDelta(t, 1.0/3, ratio(slow, fast), 1e-12)
}

func TestBenchstatLines(t *testing.T) {
	s := series{Name: "AllReduce/impl=mpi/size=1MB/ranks=2", Iters: 10, Seconds: []float64{0.001, 0.002},
		Bytes: 1 << 20, Extra: map[string]float64{"calls/op": 2}}
	lines := s.benchstatLines()
	require.Len(t, lines, 2, "one line per sample, which benchstat aggregates")
	// benchstat's format: name, iterations, then value-unit pairs separated by tabs.
	fields := strings.Split(lines[0], "\t")
	require.Len(t, fields, 5)
	assert.Equal(t, "BenchmarkAllReduce/impl=mpi/size=1MB/ranks=2", strings.TrimSpace(fields[0]))
	assert.Equal(t, "10", strings.TrimSpace(fields[1]))
	assert.Equal(t, "1000000 ns/op", strings.TrimSpace(fields[2]))
	assert.Equal(t, "1048.58 MB/s", strings.TrimSpace(fields[3]))
	assert.Equal(t, "2 calls/op", strings.TrimSpace(fields[4]))
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{64 << 10: "64KB", 1 << 20: "1MB", 25 << 20: "25MB", 100: "100B",
		3<<20 + 1<<19: "3.5MB"} {
		assert.Equal(t, want, formatBytes(n))
	}
}

func TestMeasureInterleavesVariants(t *testing.T) {
	var order []string
	var iters []int
	record := func(name string) variant {
		return variant{name, func(n int) error {
			order = append(order, name)
			iters = append(iters, n)
			return nil
		}}
	}
	const samples = 20
	out, err := group{timing: timing{Samples: samples, SampleTime: time.Millisecond, MinIters: 4, MaxIters: 4}}.
		measure(record("a"), record("b"), record("c"))
	require.NoError(t, err)
	// Warm-up and calibration (2 ops, then 3 single ops) per variant, in order.
	assert.Equal(t, strings.Split("aaaabbbbcccc", ""), order[:12])
	// Then rounds: each runs every variant once, all with the same operations per sample, in orders that
	// vary, so no variant always runs first or always follows the same one.
	rounds := order[12:]
	require.Len(t, rounds, 3*samples)
	firsts, orders := map[string]bool{}, map[string]bool{}
	for r := range samples {
		round := rounds[3*r : 3*r+3]
		assert.ElementsMatch(t, []string{"a", "b", "c"}, round)
		firsts[round[0]] = true
		orders[strings.Join(round, "")] = true
	}
	assert.Len(t, firsts, 3)
	assert.Greater(t, len(orders), 3)
	for _, n := range iters[12:] {
		assert.Equal(t, 4, n, "every sample of every variant times the same operations")
	}
	require.Len(t, out, 3)
	for _, s := range out {
		assert.Len(t, s.Seconds, samples)
		assert.Equal(t, 4, s.Iters)
	}
}

func TestMeasureReportsFailures(t *testing.T) {
	boom := errors.New("boom")
	_, err := group{timing: timing{Samples: 1}}.measure(variant{"x", func(int) error { return boom }})
	assert.ErrorIs(t, err, boom)
	assert.ErrorContains(t, err, "x")
}

// TestMeasureSettlesUntimed: with Settle, every sample is preceded by that long of Go code, which the samples
// do not include.
func TestMeasureSettlesUntimed(t *testing.T) {
	const settleFor, samples = 3 * time.Millisecond, 4
	quick := variant{"quick", func(int) error { return nil }}
	start := time.Now()
	out, err := group{timing: timing{Samples: samples, MinIters: 1, MaxIters: 1, Settle: settleFor}}.measure(quick, quick)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 2*samples*settleFor, "a sample started without settling")
	for _, s := range out {
		require.Len(t, s.Seconds, samples)
		for _, sec := range s.Seconds {
			assert.Less(t, sec, settleFor.Seconds(), "the settling was timed")
		}
	}
}
