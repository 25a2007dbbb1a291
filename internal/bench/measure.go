package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/goaccel/goaccel/backends"
)

// timing says how long and how often each variant is measured.
type timing struct {
	Samples int // timed samples per variant
	// SampleTime is the target length of one sample: the operations per sample are chosen from a warm-up
	// so that a sample lasts about this long, the same number for every compared variant.
	SampleTime         time.Duration
	MinIters, MaxIters int // bounds on the operations per sample
	// Settle is how long every rank runs Go code, untimed, before each sample. A long cgo call (the C loops
	// of the plain-MPI references) lets Go's sysmon thread fall asleep, and the next call wakes it into
	// checks every 20 µs that back off to every 10 ms only after about 12 ms of activity; each check
	// interrupts a polling rank. A Go-driven loop sampled right after a C loop paid that ramp: 1 MB
	// all-reduces on 2 ranks ran at 0.78–0.80 of MPI's bandwidth, even issued as one cgo call per
	// all-reduce, and at 0.97–1.00 with the ramp behind them. Settling first times every variant with the
	// runtime at rest, as it is in a training loop. 0: none.
	Settle time.Duration
}

// variant is one of the things compared: run performs iters operations.
type variant struct {
	name string
	run  func(iters int) error
}

// group runs the measurements of one comparison, on every rank in lockstep.
type group struct {
	// comm is what the ranks agree through (iterations, cross-rank maxima); nil in a single process.
	comm *backends.Communicator
	// barrier lines the ranks up before each sample, so that a sample times the collectives rather than
	// the skew between ranks' arrivals; nil: none.
	barrier func() error
	timing  timing
}

// measure warms every variant up, picks the operations per sample, then takes timing.Samples rounds in
// which every variant runs one sample. The order within a round is a fresh permutation each round, the
// same on every rank (seeded by the round number), so that neither a position, nor the variant that ran
// just before (and left its buffers in the caches), nor a slow phase of the machine favours a variant.
// With a communicator each sample is the slowest rank's time: a collective is done when the last rank is.
func (g group) measure(variants ...variant) ([]series, error) {
	t := g.timing
	// Warm-up: the first operations pay for page faults, MPI connection set-up and graph compilation.
	// Then each variant's operation is timed a few times; its fastest time (a shared machine only ever
	// adds) and the slowest variant's decide the operations per sample.
	var slowest time.Duration
	for _, v := range variants {
		if err := v.run(2); err != nil {
			return nil, fmt.Errorf("%s: %w", v.name, err)
		}
		fastest := time.Duration(math.MaxInt64)
		for range 3 {
			if err := g.sync(); err != nil {
				return nil, err
			}
			start := time.Now()
			if err := v.run(1); err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			fastest = min(fastest, time.Since(start))
		}
		slowest = max(slowest, fastest)
	}
	iters := 1
	if slowest > 0 {
		iters = int(math.Ceil(float64(t.SampleTime) / float64(slowest)))
	}
	iters = min(max(iters, t.MinIters, 1), max(t.MaxIters, 1))
	// Every rank must run the same number of collectives: rank 0 decides.
	if g.comm != nil && g.comm.Size() > 1 {
		n := []int64{int64(iters)}
		if err := g.comm.Broadcast(backends.BufferOf(n), 0); err != nil {
			return nil, err
		}
		iters = int(n[0])
	}
	out := make([]series, len(variants))
	for i, v := range variants {
		out[i] = series{Name: v.name, Iters: iters}
	}
	for round := range max(t.Samples, 1) {
		for _, i := range rand.New(rand.NewPCG(uint64(round), 0x5eed)).Perm(len(variants)) {
			settle(t.Settle)
			if err := g.sync(); err != nil {
				return nil, err
			}
			start := time.Now()
			if err := variants[i].run(iters); err != nil {
				return nil, fmt.Errorf("%s: %w", variants[i].name, err)
			}
			out[i].Seconds = append(out[i].Seconds, time.Since(start).Seconds()/float64(iters))
		}
	}
	return out, g.slowestRank(out)
}

// settle runs Go code for d (see timing.Settle). It spins: sleeping would let sysmon fall asleep again.
func settle(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

func (g group) sync() error {
	if g.barrier == nil {
		return nil
	}
	return g.barrier()
}

// slowestRank replaces every sample by its maximum over the ranks.
func (g group) slowestRank(out []series) error {
	if g.comm == nil || g.comm.Size() == 1 {
		return nil
	}
	var mine []float64
	for _, s := range out {
		mine = append(mine, s.Seconds...)
	}
	all := make([]float64, len(mine)*g.comm.Size())
	if err := g.comm.AllGather(backends.BufferOf(mine), backends.BufferOf(all)); err != nil {
		return err
	}
	for r := 1; r < g.comm.Size(); r++ {
		for j, x := range all[r*len(mine) : (r+1)*len(mine)] {
			all[j] = max(all[j], x)
		}
	}
	j := 0
	for i := range out {
		for k := range out[i].Seconds {
			out[i].Seconds[k] = all[j]
			j++
		}
	}
	return nil
}
