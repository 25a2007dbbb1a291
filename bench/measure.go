package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/goaccel/goaccel/backends"
)

// Timing says how long and how often each variant is measured.
type Timing struct {
	// Samples is the number of timed samples per variant.
	Samples int `json:"samples"`
	// SampleTime is the target length of one sample; the number of operations per sample is chosen from
	// a warm-up so that a sample lasts about this long, and is the same for every compared variant.
	SampleTime time.Duration `json:"sample_time"`
	// MinIters and MaxIters bound the operations per sample.
	MinIters int `json:"min_iters"`
	MaxIters int `json:"max_iters"`
}

// Variant is one of the things compared: run performs iters operations.
type Variant struct {
	Name string
	Run  func(iters int) error
}

// Group runs the measurements of one comparison on every rank in lockstep.
type Group struct {
	// Comm is the communicator the ranks agree through (iterations, cross-rank maxima); nil for a
	// single-process measurement.
	Comm *backends.Communicator
	// Barrier lines the ranks up before each sample, so that a sample times the collectives rather than
	// the skew between ranks' arrivals. Nil: none.
	Barrier func() error
	Timing  Timing
}

// Measure warms every variant up, picks the operations per sample, then takes Timing.Samples rounds in
// which every variant runs one sample. The order within a round is a fresh permutation each round, the
// same on every rank (it is seeded by the round number), so that neither a position, nor the variant that
// ran just before (and left its buffers in the caches), nor a slow phase of the machine favours a
// variant. With a communicator, each sample is the slowest rank's time: a collective is done when the
// last rank is done.
func (g Group) Measure(variants ...Variant) ([]Series, error) {
	if len(variants) == 0 {
		return nil, nil
	}
	t := g.Timing
	// Warm-up: the first operations pay for page faults, MPI connection set-up and graph compilation.
	// Then each variant's operation is timed a few times; its fastest time (a shared machine only ever
	// adds) and the slowest variant's decide the operations per sample.
	var slowest time.Duration
	for _, v := range variants {
		if err := v.Run(2); err != nil {
			return nil, fmt.Errorf("%s: %w", v.Name, err)
		}
		fastest := time.Duration(math.MaxInt64)
		for range 3 {
			if err := g.barrier(); err != nil {
				return nil, err
			}
			start := time.Now()
			if err := v.Run(1); err != nil {
				return nil, fmt.Errorf("%s: %w", v.Name, err)
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
	if g.Comm != nil && g.Comm.Size() > 1 {
		n := []int64{int64(iters)}
		if err := g.Comm.Broadcast(n, 0); err != nil {
			return nil, err
		}
		iters = int(n[0])
	}
	series := make([]Series, len(variants))
	for i, v := range variants {
		series[i] = Series{Name: v.Name, Iters: iters, Seconds: make([]float64, 0, t.Samples)}
	}
	for round := range max(t.Samples, 1) {
		for _, i := range rand.New(rand.NewPCG(uint64(round), 0x5eed)).Perm(len(variants)) {
			if err := g.barrier(); err != nil {
				return nil, err
			}
			start := time.Now()
			if err := variants[i].Run(iters); err != nil {
				return nil, fmt.Errorf("%s: %w", variants[i].Name, err)
			}
			series[i].Seconds = append(series[i].Seconds, time.Since(start).Seconds()/float64(iters))
		}
	}
	if err := g.slowestRank(series); err != nil {
		return nil, err
	}
	return series, nil
}

func (g Group) barrier() error {
	if g.Barrier == nil {
		return nil
	}
	return g.Barrier()
}

// slowestRank replaces every sample by its maximum over the ranks.
func (g Group) slowestRank(series []Series) error {
	if g.Comm == nil || g.Comm.Size() == 1 {
		return nil
	}
	var mine []float64
	for _, s := range series {
		mine = append(mine, s.Seconds...)
	}
	all := make([]float64, len(mine)*g.Comm.Size())
	if err := g.Comm.AllGather(mine, all); err != nil {
		return err
	}
	for r := 1; r < g.Comm.Size(); r++ {
		for j, x := range all[r*len(mine) : (r+1)*len(mine)] {
			all[j] = max(all[j], x)
		}
	}
	j := 0
	for i := range series {
		for k := range series[i].Seconds {
			series[i].Seconds[k] = all[j]
			j++
		}
	}
	return nil
}
