package accel

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/goaccel/goaccel/backends"
)

// The straggler rule (docs/observe.md): every stragglerWindow optimizer steps, the ranks share the median
// of their last stragglerWindow step times (one all-gather of one float64 per rank), and a rank whose
// median is at least stragglerRatio times the median of all ranks' medians, and at least
// stragglerMinExcess above it, is a straggler. The first one found is named once, on the main process;
// the checks stop there.
//
// A step's time is this rank's own share of it: the wall time from one optimizer step to the next, less the
// time it waited in collectives meanwhile. Wall times are the same on every rank (a sync waits for the
// slowest), so they cannot tell which rank is slow; the time outside waits can: the straggler waits
// least. A median over the window, not a mean, so that one slow step (a checkpoint written, a page of
// the dataset read) is not persistence.
const (
	stragglerWindow    = 20
	stragglerRatio     = 1.2
	stragglerMinExcess = time.Millisecond
	// maxStepTimes bounds the step times kept for the end-of-run quantiles: past it, every other one is
	// dropped and only every other step is kept from then on, which keeps the sample spread over the run.
	maxStepTimes = 1 << 16
)

// stragglers times this rank's optimizer steps and runs the straggler checks. It learns of a step at the
// first collective after it (the optimizer's counters change there, and every rank reaches that same
// collective with the same count), which is also the point at which every rank can run the check's
// collective: see Communicator.SetBeforeCollective.
type stragglers struct {
	a *Accelerator
	// steps is the optimizer step count seen last, at time at, when the communicator had waited waitAt.
	steps  int64
	at     time.Time
	waitAt time.Duration
	// times are step times (every stride-th step once maxStepTimes was reached), window the last ones.
	times  []time.Duration
	stride int64
	window []time.Duration
	// done: the check named a straggler (or failed); there are no more checks.
	done bool
}

func newStragglers(a *Accelerator) *stragglers {
	return &stragglers{a: a, stride: 1, window: make([]time.Duration, 0, stragglerWindow)}
}

// optimizerSteps is the count the accelerator's describer reports too: the most steps of any optimizer.
func (a *Accelerator) stepsTaken() int64 {
	var steps int64
	for _, o := range a.optimizers {
		steps = max(steps, o.Steps())
	}
	return steps
}

// beforeCollective is the communicator's SetBeforeCollective function.
func (s *stragglers) beforeCollective() {
	steps := s.a.stepsTaken()
	if steps == s.steps {
		return
	}
	now, wait := time.Now(), s.a.comm.Stats().Wait()
	// One step since the last: it is timed. The first step (compilation), a jump (a checkpoint loaded)
	// are not.
	if !s.at.IsZero() && steps == s.steps+1 {
		s.record(now.Sub(s.at) - (wait - s.waitAt))
	} else {
		s.window = s.window[:0]
	}
	s.steps, s.at, s.waitAt = steps, now, wait
	if !s.done && len(s.window) == stragglerWindow && steps%stragglerWindow == 0 && s.a.topo.WorldSize > 1 {
		s.check()
	}
}

func (s *stragglers) record(d time.Duration) {
	d = max(d, 0)
	if len(s.window) == stragglerWindow {
		copy(s.window, s.window[1:])
		s.window = s.window[:stragglerWindow-1]
	}
	s.window = append(s.window, d)
	if s.steps%s.stride != 0 {
		return
	}
	if len(s.times) == maxStepTimes {
		for i := range len(s.times) / 2 {
			s.times[i] = s.times[2*i+1]
		}
		s.times = s.times[:len(s.times)/2]
		s.stride *= 2
	}
	s.times = append(s.times, d)
}

// check shares the ranks' window medians and names a straggler, once.
func (s *stragglers) check() {
	a := s.a
	mine := []float64{quantile(s.window, 0.5).Seconds()}
	all := make([]float64, a.topo.WorldSize)
	if err := a.comm.AllGather(backends.BufferOf(mine), backends.BufferOf(all)); err != nil {
		// The communicator is broken now: the caller's collective reports it.
		s.done = true
		return
	}
	rank, ratio, median := straggler(all)
	if rank < 0 {
		return
	}
	s.done = true
	a.Printf("goaccel: rank %d is a straggler: over optimizer steps %d-%d its median step took %s, %.0f%% more "+
		"than the median of the ranks (%s); a step's time here is the rank's own, less its waits for the others "+
		"(every rank's times: Accelerator.RankTimings)\n", rank, s.steps-stragglerWindow+1, s.steps,
		seconds(all[rank]), (ratio-1)*100, seconds(median))
}

// straggler applies the rule to the ranks' window medians (seconds): it returns the slowest rank that is
// a straggler with its ratio to the median of the medians, or -1.
func straggler(medians []float64) (rank int, ratio, median float64) {
	sorted := slices.Sorted(slices.Values(medians))
	n := len(sorted)
	median = sorted[n/2]
	if n%2 == 0 {
		median = (sorted[n/2-1] + sorted[n/2]) / 2
	}
	slowest := 0
	for r, m := range medians {
		if m > medians[slowest] {
			slowest = r
		}
	}
	m := medians[slowest]
	if median <= 0 || m < stragglerRatio*median || m-median < stragglerMinExcess.Seconds() {
		return -1, 0, median
	}
	return slowest, m / median, median
}

// quantile is the nearest-rank q-quantile of ds (0 for none).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Sorted(slices.Values(ds))
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(10 * time.Microsecond)
}

// RankTiming is one rank's times over the run so far.
type RankTiming struct {
	Rank int
	// Steps is the number of optimizer steps timed: all but the first (which compiles) and those before a
	// checkpoint was loaded. StepMedian and StepP95 are the median and 95th percentile of their time: the
	// rank's own share of a step, from one optimizer step to the next less the time it waited for the
	// other ranks in collectives.
	Steps      int64
	StepMedian time.Duration
	StepP95    time.Duration
	// SyncWait is the time the rank waited for collectives to complete (gradient syncs and the others).
	SyncWait time.Duration
}

// RankTimings lists every rank's step times and waits, by rank, for the end-of-run summary: a rank
// whose steps take longer than the others' and that waits least is the one the others wait for. Steps
// are timed at the first collective after each, so a single process, which has no collectives, has no
// step times. With several processes it is collective: every rank must call it, at the same point.
func (a *Accelerator) RankTimings() (RankTimings, error) {
	if err := a.checkOpen(); err != nil {
		return nil, err
	}
	mine := a.rankTiming()
	if a.topo.WorldSize == 1 {
		return RankTimings{mine}, nil
	}
	send := []float64{float64(mine.Steps), mine.StepMedian.Seconds(), mine.StepP95.Seconds(), mine.SyncWait.Seconds()}
	all := make([]float64, len(send)*a.topo.WorldSize)
	if err := a.comm.AllGather(backends.BufferOf(send), backends.BufferOf(all)); err != nil {
		return nil, fmt.Errorf("accel: gathering the ranks' timings: %w", err)
	}
	out := make(RankTimings, a.topo.WorldSize)
	for r := range out {
		v := all[r*len(send):]
		out[r] = RankTiming{Rank: r, Steps: int64(v[0]), StepMedian: seconds(v[1]), StepP95: seconds(v[2]),
			SyncWait: seconds(v[3])}
	}
	return out, nil
}

// rankTiming is this rank's RankTiming.
func (a *Accelerator) rankTiming() RankTiming {
	t := RankTiming{Rank: a.topo.Rank, SyncWait: a.comm.Stats().Wait()}
	if s := a.stragglers; s != nil {
		t.Steps = int64(len(s.times)) * s.stride
		t.StepMedian, t.StepP95 = quantile(s.times, 0.5), quantile(s.times, 0.95)
	}
	return t
}

// RankTimings are every rank's times, by rank (Accelerator.RankTimings).
type RankTimings []RankTiming

// String is a table, a line per rank, that marks the rank with the longest median step.
func (ts RankTimings) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-5s %7s %12s %12s %12s\n", "rank", "steps", "step median", "step p95", "sync wait")
	slowest := -1
	for i, t := range ts {
		if len(ts) > 1 && t.Steps > 0 && (slowest < 0 || t.StepMedian > ts[slowest].StepMedian) {
			slowest = i
		}
	}
	for i, t := range ts {
		mark := ""
		if i == slowest {
			mark = "  (slowest)"
		}
		fmt.Fprintf(&b, "%-5d %7d %12s %12s %12s%s\n", t.Rank, t.Steps, roundDuration(t.StepMedian),
			roundDuration(t.StepP95), roundDuration(t.SyncWait), mark)
	}
	return b.String()
}

// roundDuration keeps three significant digits or so: 12.3ms, 1.23s.
func roundDuration(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond)
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
